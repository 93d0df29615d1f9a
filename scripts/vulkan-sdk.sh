#!/usr/bin/env bash
# What ggml's Vulkan backend needs to build and run on a machine without a
# GPU (Debian 12): Mesa's software Vulkan device (lavapipe), the Vulkan
# loader, glslc, and Vulkan headers new enough for ggml (VK_EXT_layer_settings,
# headers 1.3.272 or newer: Debian 12 has 1.3.239). The headers come from
# Debian 13's libvulkan-dev, unpacked into target/vulkan-sdk without
# installing anything from Debian 13.
#
# Prints the folder to export as VULKAN_SDK (CMake's FindVulkan looks there
# first for the headers; the library and glslc come from the system).
# Idempotent. Installing the Debian packages needs root (CI runs as root);
# otherwise it says which to install.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sdk="$root/target/vulkan-sdk"

# Debian 13's libvulkan-dev: headers only are used. Pinned by version and
# SHA-256 (from trixie's Packages index); one source of truth for both.
version="1.4.309.0-1"
sha256="8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a"
url="http://deb.debian.org/debian/pool/main/v/vulkan-loader/libvulkan-dev_${version}_amd64.deb"

packages=(mesa-vulkan-drivers glslc libvulkan-dev spirv-headers)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  if [[ $(id -u) != 0 ]]; then
    echo "error: install ${missing[*]} (Debian: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ ! -f "$sdk/.version" || $(cat "$sdk/.version") != "$version" ]]; then
  rm -rf "$sdk"
  mkdir -p "$sdk/download"
  deb="$sdk/download/libvulkan-dev_${version}_amd64.deb"
  curl -fsS --retry 3 -m 300 -o "$deb" "$url" || {
    echo "error: cannot download $url (Debian 13's libvulkan-dev $version)" >&2
    exit 1
  }
  echo "$sha256  $deb" | sha256sum -c --quiet - >&2 || {
    echo "error: $deb does not have the pinned SHA-256 $sha256" >&2
    exit 1
  }
  dpkg-deb -x "$deb" "$sdk/unpacked"
  mv "$sdk/unpacked/usr/include" "$sdk/include"
  rm -rf "$sdk/unpacked" "$sdk/download"
  echo "$version" >"$sdk/.version"
fi
header_version=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$sdk/include/vulkan/vulkan_core.h")
if ((header_version < 272)); then
  echo "error: $sdk/include has Vulkan headers 1.x.$header_version; ggml needs 1.3.272 or newer" >&2
  exit 1
fi
echo "$sdk"
