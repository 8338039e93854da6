"""Step-time predictors, one module each, registered by name (the protocol lands with the predictor issue)."""
