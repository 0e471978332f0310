# Sourced by scripts/setup.sh and scripts/setup-dev.sh: apt_install LABEL PACKAGE...
# installs the packages that are not installed yet; apt-get update runs once, and only when
# one is missing. Uses sudo when not root. With SHARDGAN_NO_SYSTEM_PACKAGES=1 (the scripts'
# --no-system-packages) it installs nothing: it names the missing packages, where dpkg can
# tell, and the build then uses what the machine has (docs/install.md).
apt_install() {
  local label=$1 p; shift
  local missing=()
  if command -v dpkg-query > /dev/null; then
    for p in "$@"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
  fi
  if [ "${SHARDGAN_NO_SYSTEM_PACKAGES:-0}" = 1 ]; then
    echo "[$label] --no-system-packages: no apt-get; CMake looks for each dependency where it is installed" \
         "(docs/install.md lists a source without root for each)"
    [ ${#missing[@]} -eq 0 ] || echo "[$label] Debian packages not installed here (their contents may come from elsewhere): ${missing[*]}"
    return
  fi
  if [ ${#missing[@]} -eq 0 ]; then
    echo "[$label] all Debian packages present"
    return
  fi
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "[$label] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# no_system_packages_flag "$@": sets SHARDGAN_NO_SYSTEM_PACKAGES=1 when the arguments hold
# --no-system-packages; refuses any other argument.
no_system_packages_flag() {
  local a
  for a in "$@"; do
    case "$a" in
      --no-system-packages) export SHARDGAN_NO_SYSTEM_PACKAGES=1 ;;
      *) echo "$(basename "$0"): unknown argument '$a' (the only one is --no-system-packages)" >&2; exit 2 ;;
    esac
  done
}

# need_commands LABEL CMD...: with --no-system-packages, fails naming each command missing
# from PATH (docs/install.md says where to get it without root).
need_commands() {
  local label=$1 c; shift
  local missing=()
  for c in "$@"; do command -v "$c" > /dev/null || missing+=("$c"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[$label] error: not on PATH: ${missing[*]}. Without root, docs/install.md names a source for each" \
         "(pip, conda-forge, a cluster module)." >&2
    exit 1
  fi
}
