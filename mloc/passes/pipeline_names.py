"""Pass names, importable without building the pipeline (keeps `mloc --help` fast).
A test checks that this list equals the names in `mloc.passes.pipeline.PIPELINE`."""

PASS_NAMES = ("parse", "resolve", "lower", "hierarchy", "dataflow")
