"""The autocast precisions a problem or a run may name (`precision = bf16`, `--precision`):
one home for the checker's field type, both doors' flag and the runtime's autocast."""

PRECISIONS = ("fp32", "bf16", "fp16")
