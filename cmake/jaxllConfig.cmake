# find_package(jaxll CONFIG) for out-of-tree CUDA extensions that build on jaxll's
# device API (the headers under include/jaxll, installed with the wheel):
#
#   execute_process(COMMAND python -c "import jaxll; print(jaxll.get_cmake_dir())"
#                   OUTPUT_VARIABLE jaxll_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
#   find_package(jaxll 0.1 CONFIG REQUIRED)   # (jaxllConfigVersion.cmake: same minor)
#   target_link_libraries(my_ext PRIVATE jaxll::device_api)
#
# jaxll::device_api is header-only (an INTERFACE target with the include path);
# a kernel gets a workspace's RankView at run time through the extension API
# (jaxll/extension.h, jaxll.extension in Python).
get_filename_component(_jaxll_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(jaxll_INCLUDE_DIR "${_jaxll_root}/include")
if(NOT EXISTS "${jaxll_INCLUDE_DIR}/jaxll/jaxll.cuh")
  set(jaxll_FOUND FALSE)
  set(jaxll_NOT_FOUND_MESSAGE "jaxll's device headers are missing under ${jaxll_INCLUDE_DIR}")
  return()
endif()
if(NOT TARGET jaxll::device_api)
  add_library(jaxll::device_api INTERFACE IMPORTED)
  set_target_properties(jaxll::device_api PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES "${jaxll_INCLUDE_DIR}"
                        INTERFACE_COMPILE_FEATURES cxx_std_17)
endif()
set(jaxll_FOUND TRUE)
