"""What every part of the runtime stands on: parameter tuples and pytrees, the device (mixed
precision, data-parallel collectives), and the user's own code (the program's modules, and
the errors its code raises). It may import only ``files``.
"""
