# The NCCL/CUDA module libhvdlite_cuda.so (csrc/backend/cuda/): a separate shared library
# that the core dlopens when a CUDA tensor first appears, so the core links no CUDA.
#
# HVDLITE_WITH_CUDA: auto (default: build it when nvcc and NCCL are found), 0 (never),
# 1 (required: their absence is an error). NCCL's header and libnccl.so.2 come from the
# nvidia-nccl-cu13 wheel (found through Python: `import nvidia.nccl`), or NCCL_ROOT.
# The CUDA runtime is linked statically (FindCUDAToolkit's cudart_static), so at run time
# the module needs only the driver and libnccl.so.2 (found through its RPATH).
# HVDLITE_CUDA_ARCHS: the SM architectures compiled (default 90: one, to keep builds short).

set(HVDLITE_WITH_CUDA "auto" CACHE STRING "auto | 0 | 1: build the NCCL/CUDA module")
set(HVDLITE_CUDA_ARCHS "90" CACHE STRING "CUDA architectures of the NCCL module's kernels")
set(HVDLITE_CUDA_BUILT OFF)
set(HVDLITE_NCCL_VERSION_CODE 0)  # NCCL_VERSION_CODE of the nccl.h the module is built with

function(hvd_cuda_missing what)
  if(HVDLITE_WITH_CUDA STREQUAL "1")
    message(FATAL_ERROR "HVDLITE_WITH_CUDA=1 but ${what}")
  endif()
  message(STATUS "hvdlite: ${what}; building without the NCCL module")
endfunction()

if(HVDLITE_WITH_CUDA STREQUAL "0")
  message(STATUS "hvdlite: HVDLITE_WITH_CUDA=0; building without the NCCL module")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  hvd_cuda_missing("no CUDA compiler (nvcc) was found")
  return()
endif()

if(NOT NCCL_ROOT)
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                  OUTPUT_VARIABLE NCCL_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT}/include)
find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl HINTS ${NCCL_ROOT}/lib)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  hvd_cuda_missing("NCCL was not found (pip install nvidia-nccl-cu13, or set NCCL_ROOT)")
  return()
endif()

file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h nccl_version_line REGEX "^#define NCCL_VERSION_CODE [0-9]+")
string(REGEX MATCH "[0-9]+$" nccl_version_code "${nccl_version_line}")

set(CMAKE_CUDA_ARCHITECTURES ${HVDLITE_CUDA_ARCHS})
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
message(STATUS "hvdlite: building the NCCL module (CUDA ${CUDAToolkit_VERSION}, sm_${HVDLITE_CUDA_ARCHS}, "
               "NCCL ${NCCL_LIBRARY}, NCCL_VERSION_CODE ${nccl_version_code})")

file(GLOB cuda_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/csrc/backend/cuda/*.cu
     ${CMAKE_SOURCE_DIR}/csrc/backend/cuda/*.cc)
# dtype.cc, and memory_store.cc for the set-up test helper (module.cc), compiled in: the
# module links no core library.
add_library(hvdlite_cuda MODULE ${cuda_srcs} ${CMAKE_SOURCE_DIR}/csrc/common/dtype.cc
            ${CMAKE_SOURCE_DIR}/csrc/rendezvous/memory_store.cc)
set_target_properties(hvdlite_cuda PROPERTIES PREFIX "lib" OUTPUT_NAME "hvdlite_cuda"
                      CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden
                      BUILD_RPATH "${NCCL_ROOT}/lib" INSTALL_RPATH "${NCCL_ROOT}/lib")
add_dependencies(hvdlite_cuda hvdlite_settings)
target_include_directories(hvdlite_cuda PRIVATE ${CMAKE_SOURCE_DIR}/csrc ${CMAKE_SOURCE_DIR}/csrc/include
                           ${GEN_DIR} ${NCCL_INCLUDE_DIR})
target_compile_options(hvdlite_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
target_link_libraries(hvdlite_cuda PRIVATE CUDA::cudart_static ${NCCL_LIBRARY})
# Every symbol resolved at link time: the module uses the core only through gpu_backend.h's
# interfaces (virtual calls), so a call into a core function is a link error here, not a
# dlopen failure on a GPU machine.
target_link_options(hvdlite_cuda PRIVATE -Wl,--no-undefined ${HVDLITE_LOCAL_STATIC_RUNTIME})
add_dependencies(hvdlite_modules hvdlite_cuda)
set(HVDLITE_CUDA_BUILT ON)
if(nccl_version_code)
  set(HVDLITE_NCCL_VERSION_CODE ${nccl_version_code})
endif()
