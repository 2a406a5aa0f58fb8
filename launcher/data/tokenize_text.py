"""`strata sample` on a run over token files `strata data prepare` wrote, or on a transformers
directory: the tokenizer.json encodes the prompt and decodes the continuation, with Hugging Face
`tokenizers` (the library that made the files).
  tokenize_text.py encode TOKENIZER TEXT_FILE           prints the ids as a JSON list, as the
                                                        prepared documents were encoded (no
                                                        special tokens added)
  tokenize_text.py encode_special TOKENIZER TEXT_FILE   the same with the tokenizer's special
                                                        tokens (a Llama's BOS), as transformers'
                                                        tokenizer(prompt) encodes for generate
  tokenize_text.py decode TOKENIZER IDS_FILE            prints the text the JSON list of ids decodes to
"""
import json
import sys

from tokenizers import Tokenizer

mode, tokenizer_file, path = sys.argv[1:4]
try:
    tokenizer = Tokenizer.from_file(tokenizer_file)
except Exception as error:  # the library's own message says what is wrong; name the file with it
    sys.exit(f"{tokenizer_file} is not a tokenizer.json the tokenizers library reads ({error})")
if mode in ("encode", "encode_special"):
    print(json.dumps(tokenizer.encode(open(path, encoding="utf-8").read(), add_special_tokens=mode == "encode_special").ids))
else:
    sys.stdout.write(tokenizer.decode(json.load(open(path)), skip_special_tokens=False))
