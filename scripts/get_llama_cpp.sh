#!/usr/bin/env bash
# llama.cpp for `codex-lab bench inference --peer llama.cpp`: the prebuilt CPU binaries that npm's
# node-llama-cpp ships (no compiler, a few minutes), installed into ~/.cache/codex_lab/llama.cpp
# (CODEX_LAB_LLAMA_CPP to change). Idempotent: a second run with the same version does nothing.
# Needs Node.js >= 18 and npm (Debian: apt-get install nodejs npm). Prints the versions it installed.
set -euo pipefail
VERSION="${NODE_LLAMA_CPP_VERSION:-3.22.1}"   # the version this course measured (2026-12-03)
DIR="${CODEX_LAB_LLAMA_CPP:-$HOME/.cache/codex_lab/llama.cpp}"
command -v node >/dev/null || { echo "get_llama_cpp: node not found; install Node.js >= 18 (apt-get install nodejs npm)" >&2; exit 2; }
command -v npm >/dev/null || { echo "get_llama_cpp: npm not found; install it (apt-get install npm)" >&2; exit 2; }
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || { echo "get_llama_cpp: Node.js $major is too old; node-llama-cpp needs >= 18" >&2; exit 2; }
mkdir -p "$DIR"
have="$(node -p "try{require('$DIR/node_modules/node-llama-cpp/package.json').version}catch(e){''}" 2>/dev/null || true)"
if [ "$have" != "$VERSION" ]; then
  [ -f "$DIR/package.json" ] || printf '{"name":"codex-lab-llama-cpp","private":true,"type":"module"}\n' > "$DIR/package.json"
  # the prebuilt binaries come as npm packages (@node-llama-cpp/linux-x64, ...); never build or download
  # llama.cpp sources at install time
  NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error \
    "node-llama-cpp@$VERSION"
fi
cd "$DIR"
# a file, not `node -e`: node-llama-cpp tests its binary in a forked child, which inherits node's flags
# (`--input-type` breaks it)
cat > codex_lab_version.mjs <<'JS'
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";
const v = JSON.parse(readFileSync("node_modules/node-llama-cpp/package.json", "utf8")).version;
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
console.log(`node-llama-cpp ${v}; llama.cpp release ${llama.llamaCppRelease?.release}; build ${llama.buildType}; ` +
            `gpu ${llama.gpu}; cpu math cores ${llama.cpuMathCores ?? "?"}; installed in ${process.cwd()}`);
JS
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node codex_lab_version.mjs
