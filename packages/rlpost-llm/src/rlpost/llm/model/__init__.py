"""The policy model: loading (the embedded tiny default, a local path or a hub id, LoRA),
the trainer-side log-prob forwards, shared-prompt packing and tokenizer alignment."""
