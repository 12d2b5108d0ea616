"""A run's record outside the process, torch-free: the run's options and flags, the folder
it writes into (its choice, its lock, mloc's I/O errors), the files it writes and reads
back, how a resumed run continues, the loggers beside ``metrics.jsonl``, and scratch folders
that name their owner.

The runtime's bottom layer: its modules import nothing else of the runtime and no torch of
their own (``tests/test_packaging.py``), and every layer above writes through them (a
checkpoint's I/O errors, the scratch folder of Shampoo's root buffers, the run's
``RunConfig``).
"""
