"""optimizers: SAM-family and flat-seeking Bayesian optimizers as ``torch.optim.Optimizer``s.

Every optimizer is stepped the same way::

    loss = opt.step(closure)   # closure: zero_grad, forward, backward, return loss
"""

# --- SAM family (two-pass perturb-then-descend) ---

# --- Bayesian / second-order (MFVI, bSAM, G-TRACER, flat-seeking) ---
