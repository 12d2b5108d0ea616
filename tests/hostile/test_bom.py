"""A UTF-8 byte-order mark at the start of a `.mlo` file (issue 23 item 10): editors on some
systems write one; it is not part of the program. One anywhere else is still E002."""

from __future__ import annotations

from mloc.cli import main
from tests.conftest import PROGRAMS

SOURCE = (PROGRAMS / "data_reweighting.mlo").read_text(encoding="utf-8")


def test_a_leading_byte_order_mark_is_accepted(tmp_path, capsys):
    f = tmp_path / "bom.mlo"
    f.write_bytes(b"\xef\xbb\xbf" + SOURCE.encode())
    (tmp_path / "reweighting.py").write_text((PROGRAMS / "reweighting.py").read_text())
    assert main(["check", str(f), "--color", "never"]) == 0, capsys.readouterr().err


def test_a_byte_order_mark_inside_the_program_is_still_e002(tmp_path, capsys):
    f = tmp_path / "bom.mlo"
    lines = SOURCE.splitlines(keepends=True)
    f.write_text(lines[0] + "\ufeff" + "".join(lines[1:]), encoding="utf-8")
    (tmp_path / "reweighting.py").write_text((PROGRAMS / "reweighting.py").read_text())
    assert main(["check", str(f), "--color", "never"]) == 1
    assert "E002" in capsys.readouterr().err
