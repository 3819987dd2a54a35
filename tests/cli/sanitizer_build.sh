# sanitizer_build.sh — sanitizer_build BINARY: whether the moetron BINARY was built with the
# sanitizers (its --version says so). Sourced by tests/run.sh and tests/cli/lib.sh.
sanitizer_build() { "$1" --version 2>/dev/null | grep -q sanitizers; }
