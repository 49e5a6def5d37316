# Runs in cpack on the staged package tree (CPACK_PRE_BUILD_SCRIPTS, set by cpack.cmake): adds the files every
# Debian package carries and that an install() of the project does not: /usr/share/doc/amqptap/copyright
# (machine-readable, DEP-5), changelog.Debian.gz, the lintian overrides; and strips the .comment and .note
# sections from the binary as dh_strip does. TAP_DEB_BUILT_FROM (the first line of `amqptap --version`) and
# SOURCE_DATE_EPOCH (the date of the changelog entry) come from scripts/package.sh.
set(root "${CPACK_TEMPORARY_INSTALL_DIRECTORY}")
if(NOT IS_DIRECTORY "${root}/usr/bin")
  message(FATAL_ERROR "docs.cmake: no staged tree at ${root}")
endif()
set(doc "${root}/usr/share/doc/${CPACK_PACKAGE_NAME}")
if(CPACK_DEBIAN_PACKAGE_VERSION)  # scripts/package.sh: the version with its git commit
  set(version "${CPACK_DEBIAN_PACKAGE_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
else()
  set(version "${CPACK_PACKAGE_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
endif()
set(maintainer "${CPACK_DEBIAN_PACKAGE_MAINTAINER}")
if(NOT maintainer)
  set(maintainer "${CPACK_PACKAGE_CONTACT}")  # what CPackDeb falls back to, later than this script runs
endif()

set(license "${CPACK_TAP_LICENSE}")  # TAP_LICENSE of the top-level CMakeLists.txt
if(NOT license STREQUAL "Apache-2.0")  # the only license whose text the copyright file carries
  message(FATAL_ERROR "docs.cmake: the copyright file has no text for license '${license}'")
endif()
configure_file("${CMAKE_CURRENT_LIST_DIR}/copyright" "${doc}/copyright" @ONLY)
file(CHMOD "${doc}/copyright" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# Debian changelog format (Debian Policy 4.4); the date is RFC 5322, in UTC.
string(TIMESTAMP date "%a, %d %b %Y %H:%M:%S +0000" UTC)
if(NOT TAP_DEB_BUILT_FROM)
  set(TAP_DEB_BUILT_FROM "${CPACK_PACKAGE_NAME} ${CPACK_PACKAGE_VERSION}")
endif()
file(WRITE "${doc}/changelog.Debian"
  "${CPACK_PACKAGE_NAME} (${version}) UNRELEASED; urgency=medium\n\n"
  "  * Built from ${TAP_DEB_BUILT_FROM} by scripts/package.sh;\n"
  "    the changes are in the project's git history.\n\n"
  " -- ${maintainer}  ${date}\n")
execute_process(COMMAND gzip -9nf "${doc}/changelog.Debian" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "docs.cmake: gzip failed")
endif()
file(CHMOD "${doc}/changelog.Debian.gz" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

set(overrides "${root}/usr/share/lintian/overrides")
file(MAKE_DIRECTORY "${overrides}")
configure_file("${CMAKE_CURRENT_LIST_DIR}/lintian-overrides" "${overrides}/${CPACK_PACKAGE_NAME}" COPYONLY)
file(CHMOD "${overrides}/${CPACK_PACKAGE_NAME}" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

find_program(STRIP NAMES strip REQUIRED)
execute_process(COMMAND "${STRIP}" --remove-section=.comment --remove-section=.note
  "${root}/usr/bin/${CPACK_PACKAGE_NAME}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "docs.cmake: strip failed")
endif()
