#!/usr/bin/env bash
# CPythons this machine lacks, from Debian's packages, in a chroot (needs root):
#
#   tools/debian_chroot.sh make ROOT 3.14 3.15    the chroot, made again when its inputs change
#   tools/debian_chroot.sh run ROOT -- COMMAND... COMMAND on the host, with ROOT's mounts up
#   tools/debian_chroot.sh enter ROOT COMMAND...  COMMAND inside ROOT (under `run`)
#
# `make` debootstraps Debian's stable suite (minbase) into ROOT, adds the newest suite (sid) for
# the python3.X packages alone (its Release file has expired on some mirrors, so its validity
# date is not checked; its signature is), and installs them from there with what they need.
# ROOT/.inputs holds what it was made from: the stable suite's codename, read from the mirror
# each time, the newest suite, the packages and the mirror. While they match, nothing is done;
# otherwise the chroot is made again from scratch (in ROOT.new, moved into place once complete).
#
# `run` mounts /proc, /dev, /dev/pts and /dev/shm inside ROOT, runs COMMAND (which enters the
# chroot as it needs: `chroot ROOT ...`), and unmounts them whatever happens (a trap on exit,
# interrupt and termination). Its status is COMMAND's. Where ROOT was never made, COMMAND runs
# without mounts, to say what it can't find there.
#
# `enter` runs COMMAND inside ROOT as `chroot ROOT COMMAND` would, but with ROOT made the root of
# a mount namespace of its own (pivot_root) instead: the kernel refuses user namespaces to a
# chrooted process, and the suite makes one (a tiny /dev/shm of its own). The host's tree is
# unmounted there before COMMAND starts.
#
# DEBIAN_MIRROR picks the mirror (default deb.debian.org). Without root, or without debootstrap
# and apt-get to install it, `make` says why and exits 3, so a caller can tell "can't here" from
# a failure.
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
NEWEST=sid

usage() {
    echo "usage: $0 make ROOT VERSION... | $0 run ROOT -- COMMAND..." >&2
    exit 2
}

# The chroot's mount points, in the order they are mounted (unmounted in reverse).
MOUNTS=(proc dev dev/pts dev/shm)

mount_all() {
    local root=$1
    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    mount --bind /dev/pts "$root/dev/pts"
    # a tmpfs of its own: shared memory the suites make is theirs, gone with the mount
    mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
}

# Unmounts whatever of ROOT's mounts is up; lazily where one is still busy (a process left
# behind), so that the folder is never left bound to the host's /dev.
unmount_all() {
    local root=$1 i point
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        point="$root/${MOUNTS[i]}"
        if mountpoint -q "$point"; then
            umount "$point" 2>/dev/null || umount -l "$point"
        fi
    done
}

# Removes a chroot folder, never through a mount still up in it.
remove_root() {
    local root=$1
    [[ -e $root ]] || return 0
    unmount_all "$root"
    if findmnt -rn -o TARGET | grep -q "^$(realpath "$root")/"; then
        echo "debian_chroot: $root still has mounts inside; not removing it" >&2
        exit 1
    fi
    rm -rf --one-file-system "$root"
}

stable_codename() {
    local url=$MIRROR/dists/stable/Release
    if command -v curl >/dev/null; then
        curl -fsS --max-time 30 "$url"
    else
        wget -qO- --timeout=30 "$url" # debootstrap's own dependency
    fi | sed -n 's/^Codename: //p'
}

# Unmounts ROOT's mounts when this script ends, however it ends: an interrupt or a termination
# ends it (a trap that returned would let it go on), and the exit trap unmounts.
unmount_at_exit() {
    # shellcheck disable=SC2064 # the folder is fixed when the trap is set
    trap "unmount_all $(printf %q "$1")" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

make_root() {
    local root=$1
    shift
    [[ $# -gt 0 ]] || usage
    if [[ $(id -u) != 0 ]]; then
        echo "debian_chroot: needs root (debootstrap, chroot, mount)" >&2
        exit 3
    fi
    if ! command -v debootstrap >/dev/null; then
        if ! command -v apt-get >/dev/null; then
            echo "debian_chroot: no debootstrap, and no apt-get to install it" >&2
            exit 3
        fi
        apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
    fi
    local packages=() version
    for version in "$@"; do
        packages+=("python$version")
    done
    local stable
    if ! stable=$(stable_codename) || [[ -z $stable ]]; then
        if [[ -f $root/.inputs ]]; then
            echo "debian_chroot: $MIRROR unreachable; keeping $root as it is" >&2
            return 0
        fi
        echo "debian_chroot: can't read the stable suite's codename from $MIRROR" >&2
        exit 1
    fi
    local inputs="stable=$stable newest=$NEWEST packages=${packages[*]} mirror=$MIRROR"
    if [[ -f $root/.inputs && $(cat "$root/.inputs") == "$inputs" ]]; then
        echo "debian_chroot: $root is current ($inputs)"
        return 0
    fi
    echo "debian_chroot: making $root ($inputs)"
    local new=$root.new start=$SECONDS
    remove_root "$new"
    mkdir -p "$(dirname "$root")"
    debootstrap --variant=minbase "$stable" "$new" "$MIRROR" >"$new.log" 2>&1 || {
        tail -20 "$new.log" >&2
        exit 1
    }
    rm -f "$new.log"
    echo "deb [check-valid-until=no] $MIRROR $NEWEST main" >"$new/etc/apt/sources.list.d/$NEWEST.list"
    # the newest suite only where asked for (apt-get -t below), never by an upgrade
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n' "$NEWEST" \
        >"$new/etc/apt/preferences.d/$NEWEST"
    cp /etc/resolv.conf "$new/etc/resolv.conf"
    unmount_at_exit "$new"
    mount_all "$new"
    chroot "$new" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$new" apt-get install -y -qq --no-install-recommends \
        -t "$NEWEST" "${packages[@]}" >/dev/null
    chroot "$new" apt-get clean
    unmount_all "$new"
    trap - EXIT INT TERM
    echo "$inputs" >"$new/.inputs"
    remove_root "$root"
    mv "$new" "$root"
    echo "debian_chroot: made $root in $((SECONDS - start)) s:" \
        "$(for p in "${packages[@]}"; do chroot "$root" "$p" -VV | head -1; done | paste -sd ';')"
}

run_in() {
    local root=$1
    shift
    [[ ${1-} == -- ]] || usage
    shift
    [[ $# -gt 0 ]] || usage
    [[ -f $root/.inputs ]] || exec "$@"
    unmount_at_exit "$root"
    unmount_all "$root" # what an earlier run killed with SIGKILL left behind
    mount_all "$root"
    local status=0
    "$@" || status=$?
    exit $status
}

enter_root() {
    local root
    root=$(realpath "$1")
    shift
    [[ $# -gt 0 ]] || usage
    # .host is where the old root goes; never removed, as another namespace may have its old
    # root there at the same time
    mkdir -p "$root/.host"
    # shellcheck disable=SC2016 # expanded by the shells started here
    exec unshare --mount --propagation private /bin/sh -c '
        mount --rbind "$1" "$1" && cd "$1" && pivot_root . .host && shift &&
        exec /usr/sbin/chroot . /bin/sh -c "umount -l /.host && exec \"\$@\"" sh "$@"' \
        sh "$root" "$@"
}

[[ $# -ge 2 ]] || usage
case $1 in
make) make_root "${@:2}" ;;
run) run_in "${@:2}" ;;
enter) enter_root "${@:2}" ;;
*) usage ;;
esac
