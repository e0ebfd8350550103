"""The Textual app: widgets draw the model, nothing else."""
