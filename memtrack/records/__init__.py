"""Records: the run and its measurements as frozen dataclasses, their validation and JSON
schema, the figures derived from them (metrics, breakdown), and redaction of recorded text."""
