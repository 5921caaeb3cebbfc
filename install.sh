#!/bin/sh
# Installs summon's prebuilt binary from a GitHub release (Linux x86_64 and aarch64, macOS
# x86_64 and Apple silicon) after checking its SHA-256 against the release's SHA256SUMS:
#
#   curl -fsSL https://github.com/OWNER/summon/releases/latest/download/install.sh | sh
#
# SUMMON_VERSION=v0.1.0   a given release instead of the latest
# SUMMON_INSTALL_DIR=DIR  where the binary goes (default ~/.local/bin)
# SUMMON_DOWNLOAD_URL=URL the folder that holds the release's files (a mirror, file://...)
#
# The release workflow (.github/workflows/release.yml) publishes this script with the
# repository filled in below.
set -eu

repo="@REPO@"

fail() {
  echo "summon install: $*" >&2
  exit 1
}

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-amd64) target=x86_64-unknown-linux-gnu ;;
  Linux-aarch64 | Linux-arm64) target=aarch64-unknown-linux-gnu ;;
  Darwin-x86_64) target=x86_64-apple-darwin ;;
  Darwin-arm64) target=aarch64-apple-darwin ;;
  *) fail "no prebuilt binary for $(uname -s) $(uname -m); build it from source: cargo install --locked --path ." ;;
esac

if [ -n "${SUMMON_DOWNLOAD_URL:-}" ]; then
  base="${SUMMON_DOWNLOAD_URL%/}"
else
  case "$repo" in
    @*) fail "this copy of install.sh is not a release's: set SUMMON_DOWNLOAD_URL to the folder of the release's files" ;;
  esac
  if [ -n "${SUMMON_VERSION:-}" ]; then
    base="https://github.com/$repo/releases/download/$SUMMON_VERSION"
  else
    base="https://github.com/$repo/releases/latest/download"
  fi
fi

command -v curl > /dev/null || fail "curl is needed"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
archive="summon-$target.tar.gz"
echo "summon install: downloading $base/$archive"
curl -fsSL "$base/$archive" -o "$tmp/$archive" || fail "cannot download $base/$archive"
curl -fsSL "$base/SHA256SUMS" -o "$tmp/SHA256SUMS" || fail "cannot download $base/SHA256SUMS"

expected=$(awk -v name="$archive" '$2 == name || $2 == "*" name { print $1 }' "$tmp/SHA256SUMS")
[ -n "$expected" ] || fail "SHA256SUMS has no checksum for $archive"
if command -v sha256sum > /dev/null; then
  actual=$(sha256sum "$tmp/$archive" | awk '{ print $1 }')
else
  actual=$(shasum -a 256 "$tmp/$archive" | awk '{ print $1 }')
fi
[ "$actual" = "$expected" ] || fail "checksum mismatch for $archive: expected $expected, got $actual; nothing installed"

tar -xzf "$tmp/$archive" -C "$tmp" summon || fail "$archive holds no summon binary"
dir="${SUMMON_INSTALL_DIR:-$HOME/.local/bin}"
mkdir -p "$dir"
cp "$tmp/summon" "$dir/summon.new"
chmod 755 "$dir/summon.new"
mv "$dir/summon.new" "$dir/summon"
echo "summon install: $("$dir/summon" --version) installed in $dir/summon"
case ":$PATH:" in
  *":$dir:"*) ;;
  *) echo "summon install: $dir is not on your PATH; add it: export PATH=\"$dir:\$PATH\"" ;;
esac
