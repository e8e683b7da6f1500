#!/usr/bin/env bash
# Resolves the default model and starts arbor on it.
# Model resolution: MODEL=..., else $ARBOR_MODEL, else the stories260K GGUF under $ARBOR_SHARED_DIR.
# Arguments after the binary go to `arbor serve` (tests/build/serve_readme_test.sh: --port-file).
set -euo pipefail
bin=${1:?usage: scripts/serve.sh PATH/TO/arbor}
shared=${ARBOR_SHARED_DIR:-$(cd "$(dirname "$0")/.." && pwd)/../shared}
model=${MODEL:-${ARBOR_MODEL:-}}
if [ -z "$model" ]; then
  model="$shared/models/stories260K/stories260K.gguf"
  if [ ! -f "$model" ]; then
    cat >&2 <<MSG
error: no model to serve.
  Looked for the default model at: $model
  Either put the shared data directory beside this checkout (../shared, or set ARBOR_SHARED_DIR),
  or name a GGUF model:  make serve MODEL=/path/to/model.gguf   (or export ARBOR_MODEL=...)
  A llama2.c checkpoint can be converted with:
    $bin convert llama2c MODEL.bin TOKENIZER.bin -o model.gguf
MSG
    exit 2
  fi
fi
if [ ! -f "$model" ]; then
  echo "error: model file not found: $model" >&2
  exit 2
fi
if "$bin" serve --help >/dev/null 2>&1; then
  exec "$bin" serve -m "$model" --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" "${@:2}"
fi
# Until the HTTP server lands, the main job is a streamed generation on the default model.
exec "$bin" generate -m "$model" -p "${PROMPT:-Once upon a time}" -n "${N:-200}"
