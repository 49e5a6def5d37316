#!/usr/bin/env bash
# Builds amqptap's Debian package with CPack: a RelWithDebInfo build without tests, installed under /usr,
# stripped, dependencies from dpkg-shlibdeps; scripts/dist/deb/cpack.cmake adds what debhelper would add (the
# copyright file, changelog.Debian.gz, lintian overrides). Prints the .deb's path as the last line of stdout
# (the build's own output goes to stderr).
# Env: TAP_PKG_BUILD_DIR (build-pkg). Needs: cmake, gcc, pkg-config, libevent-dev, libssl-dev, libpcap-dev, dpkg-dev, file.
# Install it with `dpkg -i` (or `apt-get install ./amqptap_*.deb`); tests/package/test_package.py does.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir=${TAP_PKG_BUILD_DIR:-$TAP_REPO/build-pkg}
for tool in cmake cpack dpkg-shlibdeps file; do
	command -v "$tool" >/dev/null || tap_die "$tool is missing (Debian: cmake, dpkg-dev, file)"
done
cmake -S "$TAP_REPO" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
	-DTAP_BUILD_TESTS=OFF -DTAP_SANITIZE=OFF -DTAP_FUZZ=OFF >&2
cmake --build "$dir" -j"$(nproc)" >&2
rm -f "$dir"/amqptap_*.deb
# The changelog entry names the build (`amqptap --version`) and is dated by the commit it was built from.
built_from=$("$dir/amqptap" --version)
built_from=${built_from%%$'\n'*}
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$TAP_REPO" log -1 --format=%ct 2>/dev/null || date +%s)}
# A build from git is version+gitN.gCOMMIT (N: the commits up to it), so a package built from a later commit is
# newer to dpkg and apt (with the bare project version every build was 0.1.0-1, and `apt-get install` of a newer
# one did nothing); ".dirty" when the tree had changes. Outside git: the project version.
# The count is of the commit the binary was built from; a shallow clone cannot count, so it gets the plain version.
version=${built_from#amqptap }
version=${version%% *}
if [[ $built_from =~ \(git\ ([0-9a-f]{12})(-dirty)?\) ]] &&
	[ "$(git -C "$TAP_REPO" rev-parse --is-shallow-repository 2>/dev/null)" = false ] &&
	count=$(git -C "$TAP_REPO" rev-list --count "${BASH_REMATCH[1]}" 2>/dev/null); then
	version+="+git$count.g${BASH_REMATCH[1]}${BASH_REMATCH[2]:+.dirty}"
fi
(cd "$dir" && SOURCE_DATE_EPOCH=$epoch cpack -G DEB -D CPACK_PROJECT_CONFIG_FILE="$TAP_REPO/scripts/dist/deb/cpack.cmake" \
	-D CPACK_DEBIAN_PACKAGE_VERSION="$version" -D TAP_DEB_BUILT_FROM="$built_from") >&2
debs=("$dir"/amqptap_*.deb)
[ -f "${debs[0]}" ] || tap_die "cpack made no .deb in $dir"
tap_log "built ${debs[0]}"
echo "${debs[0]}"
