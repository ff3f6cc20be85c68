"""Framework hooks: capture tensors during training (PyTorch, Keras, XGBoost)."""
