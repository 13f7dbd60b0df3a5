"""interop: Hugging Face transformers. The weight and config mapping to and from GPT-2 and GPT-NeoX (convert.py,
no file I/O), hub and folder import and export (hf.py), the export command (export.py), the model code
shipped into exported folders for what transformers has no native class for (remote_code/), and exports opened in
TransformerLens (transformer_lens_bridge.py: imported by nobody here, transformer_lens is optional).

May import: model/, data/, runtime/, store/ (checkpoints). Never training/.
"""
