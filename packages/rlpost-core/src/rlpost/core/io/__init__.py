"""Run scaffolding shared by every domain, so that each keeps only what is its own.

=====================  ==============================================================
module                 what
=====================  ==============================================================
``checkpoint``         atomic safetensors checkpoints (pickle-free), rotation, resume
``metrics``            ``metrics.jsonl`` (+ TensorBoard when installed) and its reader
``rundir``             the run directory and its atomically written ``config.yaml``
``curves``             ``curves.png`` (panels of metric keys) and the summary table
``recipes``            ``--config <name or path>``: shipped recipe lookup
``config``             defaults <- YAML <- ``a.b=c`` overrides, validated, errors name fields
``schema``             config bases: ``Strict``, ``LoraConfig``, ``OptimConfig``,
                       ``RunConfig``, ``CheckpointedRunConfig``
``cache``              the build cache of the embedded default models
=====================  ==============================================================

The only part of ``rlpost.core`` that touches anything besides torch and numpy:
safetensors, TensorBoard when installed, pydantic / OmegaConf / PyYAML (the ``config``
extra) and matplotlib (imported when a curve is drawn). See docs/architecture.md.
"""
