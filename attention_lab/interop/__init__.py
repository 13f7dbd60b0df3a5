"""interop: Hugging Face transformers. The weight and config mapping to and from GPT-2 and GPT-NeoX (convert.py,
no file I/O), hub and folder import and export (hf.py), the export command (export.py), and the model code
shipped into exported folders for what transformers has no native class for (remote_code/).

May import: model/, data/, runtime/, store/ (checkpoints). Never training/.
"""
