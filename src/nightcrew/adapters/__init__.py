"""One module per outside system. Core code receives these through the Runtime."""
