# CPack project config for the .deb, given to cpack by scripts/package.sh (CPACK_PROJECT_CONFIG_FILE): what
# debhelper would add to a Debian package built without it. The extended description wrapped to 79 columns
# (Debian Policy 5.6.13), and docs.cmake run on the staged tree before CPack builds the package from it.
if(NOT CPACK_GENERATOR STREQUAL "DEB")
  return()
endif()

string(REGEX REPLACE "[ \t\n]+" " " words "${CPACK_PACKAGE_DESCRIPTION}")
string(STRIP "${words}" words)
string(REPLACE " " ";" words "${words}")
set(wrapped "")
set(line "")
foreach(word IN LISTS words)
  string(LENGTH "${line} ${word}" width)
  if(line STREQUAL "")
    set(line "${word}")
  elseif(width GREATER 79)
    string(APPEND wrapped "${line}\n")
    set(line "${word}")
  else()
    string(APPEND line " ${word}")
  endif()
endforeach()
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "${wrapped}${line}")

list(APPEND CPACK_PRE_BUILD_SCRIPTS "${CMAKE_CURRENT_LIST_DIR}/docs.cmake")
