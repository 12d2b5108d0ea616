"""Compiler passes over the program: resolve, lower, hierarchy, dataflow (and later plan)."""
