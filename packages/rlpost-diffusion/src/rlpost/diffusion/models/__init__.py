"""Flow policies of the diffusion domain: the protocol (``base``), the embedded digits
model (``digits``) and Stable Diffusion 3 with LoRA (``sd3``)."""
