"""toy_problems: the seed papers' 2-D problems and the figures they illustrate."""
