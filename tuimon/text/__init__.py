"""The views' words and pictures in text, with no Textual: a job's document as lines
(job_text), a relay's incidents (incident_text), a budget's burn-down (burn_plot),
sparklines, a severity's theme colour, and text from the network made safe for Textual
markup. The screens (tuimon.ui) and the text commands (`tuimon status`, the readout)
share them; they read the model and nothing else (tests/test_boundaries.py)."""
