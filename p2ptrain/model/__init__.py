"""What a run produces: checkpoints, exports, and loading a trained model back.

- ``checkpoint``   atomic local checkpoints, the last ``keep`` retained, corrupt ones skipped
- ``export``       a portable directory: ``model.safetensors``, ``config.json``, a model card
- ``hfexport``     the Hugging Face layout: ByteLM as GPT-2 with a byte tokenizer, the hub upload
- ``load``         a trained model from an export, a checkpoint or a node's config
- ``limits``       what a model config may make us do: trusted task code only, a bounded parameter count
- ``device``       training.device and training.precision: placement, autocast, CPU staging
- ``fingerprint``  the hash of what makes two nodes' models averageable together

May import: torch, safetensors, tokenizers and huggingface_hub (deferred), :mod:`p2ptrain.tasks`,
:mod:`p2ptrain.config`.
"""
