"""A module that Python cannot parse, on purpose (E109_module_syntax_error.mlo imports it):
the `)` of `loader`'s parameters is missing. `mloc check` reports it here, never importing it."""

import torch


def loader(batch_size: int = 8:    #! E109@31
    return [(torch.zeros(batch_size, 4), torch.zeros(batch_size))]


def loss(*problems_and_batch):
    return torch.zeros(())
