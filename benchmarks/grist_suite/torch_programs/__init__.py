"""The PyTorch programs of GRIST's benchmark, re-expressed as CDeepFuzz target factories (one module per subject)."""
