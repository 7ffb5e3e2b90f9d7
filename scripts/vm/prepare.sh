#!/usr/bin/env bash
# Prepares what tests/guest.py needs to boot a QEMU guest that runs this host's own binaries
# (the host root filesystem is mounted read-only over 9p): QEMU and busybox-static from apt,
# the Debian kernel (downloaded, NOT installed: extracted into target/vm/kernel/) and an
# initramfs (target/vm/initramfs.cpio.gz) with busybox, the virtio / 9p / virtio-net modules
# and the init script (scripts/vm/init). Idempotent; run as root. Called by scripts/install.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
VM=target/vm
mkdir -p "$VM"

apt_packages=(qemu-system-x86 busybox-static xz-utils cpio kmod gzip)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
if [ ${#missing[@]} -gt 0 ]; then
    echo "vm/prepare: apt packages: ${missing[*]}"
    apt-get update -qq && apt_updated=1
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The concrete kernel package behind the linux-image-amd64 metapackage (e.g. linux-image-6.1.0-56-amd64).
kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1; }
KPKG=$(kpkg)
if [ -z "$KPKG" ] && [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; KPKG=$(kpkg); fi
[ -n "$KPKG" ] || { echo "vm/prepare: cannot resolve linux-image-amd64" >&2; exit 1; }
KVER=${KPKG#linux-image-}

KDIR=$VM/kernel
if [ ! -f "$KDIR/boot/vmlinuz-$KVER" ]; then
    echo "vm/prepare: kernel $KPKG (download + extract, not installed)"
    rm -rf "$VM/deb" "$KDIR"
    mkdir -p "$VM/deb"
    # apt-get download drops privileges to _apt; give it a directory it may write to.
    chmod 0777 "$VM/deb" 2>/dev/null || true
    (cd "$VM/deb" && apt-get download -q "$KPKG" >/dev/null 2>&1) \
        || { [ $apt_updated = 0 ] && apt-get update -qq && (cd "$VM/deb" && apt-get download -q "$KPKG" >/dev/null); }
    dpkg-deb -x "$VM"/deb/"$KPKG"_*.deb "$KDIR.tmp"
    # The .deb ships no modules.dep (depmod runs at install time); generate it in place.
    depmod -b "$KDIR.tmp" "$KVER"
    mv "$KDIR.tmp" "$KDIR"
    rm -rf "$VM/deb"
fi
KCONFIG=$KDIR/boot/config-$KVER

# The bzImage is xz-compressed, and decompressing it in the guest under TCG costs ~8 s per boot.
# Decompress its payload once here (boot-protocol header: setup_sects at 0x1f1, payload_offset
# at 0x248 and payload_length at 0x24c; the payload's last 4 bytes are the uncompressed size):
# QEMU boots the resulting ELF vmlinux directly through its PVH entry point (CONFIG_PVH=y).
if [ ! -f "$VM/vmlinux-$KVER" ] && grep -q '^CONFIG_PVH=y' "$KCONFIG"; then
    bz=$KDIR/boot/vmlinuz-$KVER
    u() { od -An -tu"$1" -j"$2" -N"$1" "$bz" | tr -d ' '; }
    ss=$(u 1 $((0x1f1))); [ "$ss" = 0 ] && ss=4
    start=$(( (ss + 1) * 512 + $(u 4 $((0x248))) )); len=$(u 4 $((0x24c)))
    tail -c +$((start + 1)) "$bz" > "$VM/payload.tmp"; truncate -s "$len" "$VM/payload.tmp"
    want=$(tail -c 4 "$VM/payload.tmp" | od -An -tu4 | tr -d ' ')
    # xz reports the kernel's trailing size field as garbage; the length check below decides.
    xz -dc < "$VM/payload.tmp" > "$VM/vmlinux.tmp" 2>/dev/null || true
    rm -f "$VM/payload.tmp"
    if [ "$(stat -c %s "$VM/vmlinux.tmp")" = "$want" ] && [ "$(head -c 4 "$VM/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
        rm -f "$VM"/vmlinux-*; mv "$VM/vmlinux.tmp" "$VM/vmlinux-$KVER"
    else
        echo "vm/prepare: could not decompress the kernel (booting the bzImage instead)" >&2
        rm -f "$VM/vmlinux.tmp"
    fi
fi
MODDIR=$KDIR/lib/modules/$KVER

ln -sf "kernel/boot/vmlinuz-$KVER" "$VM/vmlinuz"
if [ -f "$VM/vmlinux-$KVER" ]; then ln -sf "vmlinux-$KVER" "$VM/vmlinux"; else rm -f "$VM/vmlinux"; fi

INITRD=$VM/initramfs.cpio.gz
build_initramfs() {
    echo "vm/prepare: initramfs for $KVER"
    ROOTFS=$VM/initramfs.tmp
    rm -rf "$ROOTFS"
    mkdir -p "$ROOTFS"/{bin,sbin,proc,sys,dev,mnt/root,lib/modules,etc,tmp}
    cp /bin/busybox "$ROOTFS/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ -e "$ROOTFS/bin/$applet" ] || ln -s busybox "$ROOTFS/bin/$applet"
    done
    install -m 0755 scripts/vm/init "$ROOTFS/init"

    # Modules: the roots below plus everything they depend on (modules.dep), dependencies first.
    # Anything built into the kernel (=y, listed in modules.builtin) is skipped.
    roots=(virtio_pci virtio_net 9pnet_virtio 9p)
    declare -A done_mod=()
    order=()
    modpath() { # module name -> path relative to MODDIR ('-' and '_' are interchangeable)
        local n=${1//-/_}
        awk -F: -v n="$n" '{ f=$1; b=f; sub(/.*\//, "", b); sub(/\.ko(\.xz|\.zst|\.gz)?$/, "", b); gsub(/-/, "_", b);
                             if (b == n) { print f; exit } }' "$MODDIR/modules.dep"
    }
    add_mod() { # path relative to MODDIR; depth-first so dependencies come first
        local rel=$1 dep
        [ -n "${done_mod[$rel]:-}" ] && return
        done_mod[$rel]=1
        for dep in $(awk -F: -v f="$rel" '$1 == f { print $2; exit }' "$MODDIR/modules.dep"); do
            add_mod "$dep"
        done
        order+=("$rel")
    }
    for m in "${roots[@]}"; do
        if grep -qE "/${m//_/[-_]}\.ko\$" "$MODDIR/modules.builtin" 2>/dev/null; then
            echo "vm/prepare:   $m is built in"; continue
        fi
        rel=$(modpath "$m")
        [ -n "$rel" ] || { echo "vm/prepare: module $m not found in $MODDIR" >&2; exit 1; }
        add_mod "$rel"
    done
    : > "$ROOTFS/lib/modules/load.order"
    for rel in "${order[@]}"; do
        base=$(basename "$rel")
        case "$base" in   # busybox insmod cannot load compressed modules: decompress on the host
            *.ko.xz)  xz -dc "$MODDIR/$rel" > "$ROOTFS/lib/modules/${base%.xz}"; base=${base%.xz} ;;
            *.ko.zst) zstd -qdc "$MODDIR/$rel" > "$ROOTFS/lib/modules/${base%.zst}"; base=${base%.zst} ;;
            *.ko.gz)  gzip -dc "$MODDIR/$rel" > "$ROOTFS/lib/modules/${base%.gz}"; base=${base%.gz} ;;
            *)        cp "$MODDIR/$rel" "$ROOTFS/lib/modules/$base" ;;
        esac
        echo "$base" >> "$ROOTFS/lib/modules/load.order"
    done
    echo "vm/prepare:   modules: $(tr '\n' ' ' < "$ROOTFS/lib/modules/load.order")"
    for opt in CONFIG_VIRTIO_PCI CONFIG_VIRTIO_NET CONFIG_NET_9P_VIRTIO CONFIG_9P_FS CONFIG_DEVTMPFS CONFIG_TMPFS CONFIG_SERIAL_8250_CONSOLE; do
        grep -qE "^$opt=[ym]" "$KCONFIG" || { echo "vm/prepare: kernel lacks $opt" >&2; exit 1; }
    done

    (cd "$ROOTFS" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) | gzip -6 > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$ROOTFS"
    echo "$STAMP" > "$VM/initramfs.stamp"
    echo "vm/prepare: built $INITRD"
}

STAMP="$KVER $(sha256sum scripts/vm/prepare.sh scripts/vm/init /bin/busybox | sha256sum | cut -c1-16)"
if [ -f "$INITRD" ] && [ "$(cat "$VM/initramfs.stamp" 2>/dev/null)" = "$STAMP" ]; then
    echo "vm/prepare: up to date (kernel $KVER, $INITRD)"
else
    build_initramfs
fi

# Can KVM really boot the guest here, or does it need TCG? Probed once (a few seconds, up to
# 20 s when /dev/kvm opens but cannot run the kernel) and cached in target/vm/accel.
if command -v python3 >/dev/null 2>&1; then
    echo "vm/prepare: accelerator: $(python3 tests/guest.py accel)"
fi
