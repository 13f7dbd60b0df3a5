"""attention-lab's GPT as transformers remote code (`trust_remote_code=True`).

attention_lab.export copies configuration_attention_lab.py and modeling_attention_lab.py verbatim into an exported
folder for models no transformers architecture computes exactly (ALiBi, QK-norm, soft-capped logits, value
residual). They import only torch and transformers, never attention-lab, so the folder works anywhere.
"""
