"""A program built and stepped: what generated code declares turned into live objects
(modules, losses bound to parameters, data streams, learning-rate schedules), ``Program``
(the vocabulary train.py calls), its evaluations, and its training state (snapshot,
restore, checkpoint files). It may import the layers below it, never ``run`` or
``processes``.
"""
