# Fake GPU device files shared by the Slurm and the PBS test clusters (sourced by both cluster.sh).
#
# The files must sit in /dev under their real names, so they are global to the host while each
# cluster's state is private. A ledger in $FAKE_DEVICES_LEDGER records, per device file this code
# made, which clusters hold it; a cluster's `down` releases its holds and removes a file only when
# no other cluster still holds it. A device file that existed before (a real GPU, or one made by
# hand) has no ledger entry and is never removed.
FAKE_DEVICES_LEDGER=${FAKE_DEVICES_LEDGER:-/run/gpuslurm-fake-devices}
FAKE_NVIDIA_MAJOR=195
# The nvidia-uvm and nvidia-caps majors are assigned when the driver loads; any free one works.
FAKE_UVM_MAJOR=511
FAKE_CAPS_MAJOR=235

_fake_lock() {
    mkdir -p "$FAKE_DEVICES_LEDGER"
    exec {_fake_lock_fd}>"$FAKE_DEVICES_LEDGER/.lock"
    flock "$_fake_lock_fd"
}

_fake_unlock() { exec {_fake_lock_fd}>&-; }

_fake_entry() { printf '%s/%s' "$FAKE_DEVICES_LEDGER" "$(printf '%s' "$1" | md5sum | cut -c1-16)"; }

_fake_hold() {  # _fake_hold OWNER PATH: OWNER holds PATH (made by this ledger)
    local entry; entry=$(_fake_entry "$2")
    mkdir -p "$entry"
    printf '%s\n' "$2" >"$entry/path"
    : >"$entry/holder-$(printf '%s' "$1" | md5sum | cut -c1-16)"
}

fake_device() {  # fake_device OWNER PATH MAJOR MINOR: make PATH (c MAJOR:MINOR) or share it
    local owner=$1 path=$2 major=$3 minor=$4 have parent
    if [[ -e $path || -L $path ]]; then
        if [[ ! -c $path || -L $path ]]; then
            echo "$path exists and is not a character device; not touching it" >&2; return 1
        fi
        have=$(stat -c '%t:%T' "$path")
        if [[ $have != "$(printf '%x:%x' "$major" "$minor")" ]]; then
            echo "$path exists with device numbers $have (hex), not $major:$minor; not touching it" >&2
            return 1
        fi
        # Made by another test cluster: hold it too. Otherwise it is not ours.
        [[ ! -d $(_fake_entry "$path") ]] || _fake_hold "$owner" "$path"
        return 0
    fi
    parent=$(dirname "$path")
    if [[ ! -d $parent ]]; then
        mkdir -p "$parent"
        _fake_hold "$owner" "$parent"
    elif [[ -d $(_fake_entry "$parent") ]]; then
        _fake_hold "$owner" "$parent"
    fi
    mknod -m 666 "$path" c "$major" "$minor"
    _fake_hold "$owner" "$path"
}

fake_devices_from_gres() {  # fake_devices_from_gres OWNER GRES_CONF: every device file it names
    local owner=$1 conf=$2 path minor
    _fake_lock
    while read -r path; do
        case $path in
            */nvidia-caps/nvidia-cap[0-9]*)
                fake_device "$owner" "$path" "$FAKE_CAPS_MAJOR" "${path##*nvidia-cap}" || return 1 ;;
            /dev/nvidia[0-9]*)
                minor=${path#/dev/nvidia}
                [[ $minor =~ ^[0-9]+$ ]] || { echo "gres.conf names $path, which cannot be made" >&2; return 1; }
                fake_device "$owner" "$path" "$FAKE_NVIDIA_MAJOR" "$minor" || return 1 ;;
            *) echo "gres.conf names $path, which cannot be made" >&2; return 1 ;;
        esac
    done < <(grep -v '^\s*#' "$conf" | grep -oE '(File|MultipleFiles)=[^ ]+' | cut -d= -f2 \
             | tr ',' '\n' | sort -u)
    fake_device "$owner" /dev/nvidiactl "$FAKE_NVIDIA_MAJOR" 255 || return 1
    fake_device "$owner" /dev/nvidia-uvm "$FAKE_UVM_MAJOR" 0 || return 1
    fake_device "$owner" /dev/nvidia-uvm-tools "$FAKE_UVM_MAJOR" 1 || return 1
    _fake_unlock
}

fake_devices_release() {  # fake_devices_release OWNER: drop OWNER's holds; remove unheld files
    local owner=$1 holder entry path dirs=()
    [[ -d $FAKE_DEVICES_LEDGER ]] || return 0
    _fake_lock
    holder=holder-$(printf '%s' "$owner" | md5sum | cut -c1-16)
    for entry in "$FAKE_DEVICES_LEDGER"/*/; do
        entry=${entry%/}
        [[ -f $entry/$holder ]] || continue
        rm -f "$entry/$holder"
        compgen -G "$entry/holder-*" >/dev/null && continue
        path=$(<"$entry/path")
        if [[ -d $path ]]; then
            dirs+=("$path")  # after the files in it
        elif [[ -c $path ]]; then
            rm -f "$path"
        fi
        rm -rf "$entry"
    done
    for path in "${dirs[@]}"; do
        rmdir "$path" 2>/dev/null || echo "left $path: not empty" >&2
    done
    _fake_unlock
}
