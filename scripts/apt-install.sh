# Sourced by scripts/setup.sh and scripts/setup-dev.sh: apt_install LABEL PACKAGE...
# installs the packages that are not installed yet; apt-get update runs once, and only when
# one is missing. Uses sudo when not root.
apt_install() {
  local label=$1 p; shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
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
