# Finds the CUDA toolkit for the `cuda` device and its kernels (meshtrain/cuda/).
#
# MESHTRAIN_CUDA selects: AUTO builds CUDA support when nvcc and the toolkit libraries are found,
# ON requires them (configure fails otherwise), OFF never looks. Sets:
#   MESHTRAIN_HAVE_CUDA  ON when the CUDA sources are compiled into meshtrain_lib
#   MESHTRAIN_HAVE_NCCL  ON when NCCL (header and library) was found as well
#   MESHTRAIN_NCCL_INCLUDE_DIR, MESHTRAIN_NCCL_LIBRARY
#   MESHTRAIN_HAVE_CUDNN ON when cuDNN (header and library; the toolkit ships it) was found
#   MESHTRAIN_CUDNN_INCLUDE_DIR, MESHTRAIN_CUDNN_LIBRARY
# A machine without a GPU or without the driver library can build everything: the driver is only
# needed at run time, where its absence reads as "no CUDA device".

set(MESHTRAIN_CUDA AUTO CACHE STRING "Build the cuda device: AUTO (when the toolkit is found), ON, OFF")
set_property(CACHE MESHTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${MESHTRAIN_CUDA}" _mt_cuda_mode)
if(NOT _mt_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MESHTRAIN_CUDA must be AUTO, ON or OFF, not '${MESHTRAIN_CUDA}'")
endif()

set(MESHTRAIN_HAVE_CUDA OFF)
set(MESHTRAIN_HAVE_NCCL OFF)
set(MESHTRAIN_HAVE_CUDNN OFF)

if(_mt_cuda_mode STREQUAL "OFF")
  message(STATUS "meshtrain: building without the cuda device (MESHTRAIN_CUDA=OFF)")
else()
  # The toolkit is usually outside PATH; look in its standard place too.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # H100/H200 (sm_90) only by default: every extra architecture multiplies device compile time.
    # Override with -DCMAKE_CUDA_ARCHITECTURES="80;90" for A100s, or "native" on a GPU machine.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to compile for")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()

  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cudart AND TARGET CUDA::cublasLt)
    set(MESHTRAIN_HAVE_CUDA ON)
    # CMake 3.25 does not know nvcc's C++20 flag (nvcc has had it since CUDA 12): teach it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    # cudart as a shared library: one runtime per process, shared with cuBLASLt and NCCL.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    message(STATUS "meshtrain: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")

    find_path(MESHTRAIN_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
      PATH_SUFFIXES include)
    find_library(MESHTRAIN_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
      ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    if(MESHTRAIN_NCCL_INCLUDE_DIR AND MESHTRAIN_NCCL_LIBRARY)
      set(MESHTRAIN_HAVE_NCCL ON)
      message(STATUS "meshtrain: NCCL ${MESHTRAIN_NCCL_LIBRARY}")
    else()
      message(STATUS "meshtrain: NCCL not found; the nccl process group is not built")
    endif()
    find_path(MESHTRAIN_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
      PATH_SUFFIXES include)
    find_library(MESHTRAIN_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR}
      ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    if(MESHTRAIN_CUDNN_INCLUDE_DIR AND MESHTRAIN_CUDNN_LIBRARY)
      set(MESHTRAIN_HAVE_CUDNN ON)
      message(STATUS "meshtrain: cuDNN ${MESHTRAIN_CUDNN_LIBRARY}")
    else()
      message(STATUS "meshtrain: cuDNN not found; convolutions refuse cuda tensors")
    endif()
  elseif(_mt_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON but the CUDA toolkit (nvcc, cudart, cuBLASLt) was not found")
  else()
    message(STATUS "meshtrain: CUDA toolkit not found; building without the cuda device")
  endif()
endif()
