#!/bin/sh
# Puts the isolation library on the node: run by the node-agent DaemonSet's init container
# (deploy/kustomize/base/node-agent.yaml) from the node-agent image
# (deploy/images/node-agent.Dockerfile). Paths match nodeAgent.isolation in shared/config.py.
#
#   install-isolation.sh [TARGET_DIR]
#
# TARGET_DIR (default $TESSERA_ISOLATION_DIR, else /usr/local/vgpu) is the host directory,
# mounted at the same path. Other settings, from the environment:
#   TESSERA_ISOLATION_LIBRARY         the library in this image
#                                     (/opt/tessera/isolation/libvgpu.so)
#   TESSERA_ISOLATION_CONTAINER_PATH  where containers see it: libraryContainerPath
#                                     (/usr/local/vgpu/libvgpu.so)
#   TESSERA_ISOLATION_LOCK_DIR        the shared lock directory, lockDir (/tmp/vgpulock);
#                                     prepared only when it exists (is mounted)
#
# Each file is written under a temporary name in TARGET_DIR and then renamed over the old one,
# so a container starting meanwhile sees the old file or the new one, never half of one, and
# processes that already mapped the old library keep their copy.
set -eu

target="${1:-${TESSERA_ISOLATION_DIR:-/usr/local/vgpu}}"
library="${TESSERA_ISOLATION_LIBRARY:-/opt/tessera/isolation/libvgpu.so}"
container_path="${TESSERA_ISOLATION_CONTAINER_PATH:-/usr/local/vgpu/libvgpu.so}"
lock_dir="${TESSERA_ISOLATION_LOCK_DIR:-/tmp/vgpulock}"

name="$(basename "$library")"
tmp_library="$target/.$name.tmp.$$"
tmp_preload="$target/.ld.so.preload.tmp.$$"
trap 'rm -f "$tmp_library" "$tmp_preload"' EXIT

if [ ! -f "$library" ]; then
    echo "install-isolation: $library is missing from this image" >&2
    exit 1
fi
mkdir -p "$target" "$target/containers"

if cmp -s "$library" "$target/$name"; then
    echo "install-isolation: $target/$name is up to date"
else
    cp "$library" "$tmp_library"
    chmod 0755 "$tmp_library"
    mv -f "$tmp_library" "$target/$name"
    echo "install-isolation: installed $target/$name"
fi

# The file the node agent mounts over a container's /etc/ld.so.preload: one line naming the
# library's path inside the container (the agent writes the same at start).
printf '%s\n' "$container_path" >"$tmp_preload"
chmod 0644 "$tmp_preload"
mv -f "$tmp_preload" "$target/ld.so.preload"
echo "install-isolation: $target/ld.so.preload names $container_path"

# Every container of every user takes the same lock file there: let non-root ones open it.
if [ -d "$lock_dir" ]; then
    chmod 1777 "$lock_dir"
    touch "$lock_dir/lock"
    chmod 0666 "$lock_dir/lock"
    echo "install-isolation: $lock_dir is shared"
fi
