"""Integrations with other libraries; each submodule imports its library (flashattn itself does
not): ``flashattn.integrations.transformers`` for Hugging Face transformers."""
