"""The measurement protocol run on the embedded engine (`pdexporter.sim`) in virtual time:
predicted grids (`grid`), a profile fitted to measured records (`calibrate`), passive mode beside a
synthetic load in process (`passive`). Its numbers are a model and say so (MODELLED)."""
