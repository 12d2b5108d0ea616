"""Chain programs for the tests, written into a temporary folder beside `hand.py`."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent

HAND = """program hand
import hand as h
problem stage1 {{
    module    = h.Scale(value=2)
    data      = h.one_example()
    loss      = h.aux1(stage1, batch)
    optimizer = sgd(lr=1.0)
}}
problem stage2 {{
    module    = h.Scale(value=3)
    data      = h.one_example()
    loss      = h.aux2(stage1, stage2, batch)
    optimizer = sgd(lr=1.0)
}}
problem stage3 {{
    module    = h.Scale(value=4)
    data      = h.one_example()
    loss      = h.final3(stage1, stage2, stage3, batch)
    optimizer = sgd(lr=1.0)
}}
chain [stage1, stage2, stage3] {{ interlock = {n} }}
train {{ steps = 1, seed = 0 }}
"""

NET = """program net
import hand as h
problem stage1 {{
    module    = h.Block(fan_in=5, width=7)
    data      = h.blobs(batch_size=16)
    loss      = h.loss1(stage1, batch)
    optimizer = {opt}
}}
problem stage2 {{
    module    = h.Block(fan_in=7, width=6)
    data      = h.blobs(batch_size=16)
    loss      = h.loss2(stage1, stage2, batch)
    optimizer = {opt}
}}
problem stage3 {{
    module    = h.Block(fan_in=6, width=4)
    data      = h.blobs(batch_size=16)
    loss      = h.loss3(stage1, stage2, stage3, batch)
    optimizer = {opt}
}}
chain [stage1, stage2, stage3] {{ interlock = {n} }}
train {{ steps = 10, seed = 0 }}
"""


def write(folder: Path, template: str, **fields) -> Path:
    """The program `template` with `fields` in `folder`, with `hand.py` beside it."""
    shutil.copy(HERE / "hand.py", folder / "hand.py")
    path = folder / f"{template.split()[1]}_{fields.get('n')}.mlo"
    path.write_text(template.format(**fields), encoding="utf-8")
    return path
