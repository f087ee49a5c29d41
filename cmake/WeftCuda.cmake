# Optional CUDA: GPU paths are built when a CUDA compiler is found (WEFT_CUDA
# AUTO, the default) or demanded (ON); OFF builds the CPU-only configuration.
# The result is WEFT_HAVE_CUDA and, when ON, the imported targets
# weft::cudnn and weft::nccl next to CUDAToolkit's CUDA::cudart / CUDA::cublas.
#
# One CUDA runtime mode for the whole project (Shared): linking CUDA::cudart
# while CMake adds the static runtime to .cu targets puts two runtimes in one
# binary.
set(WEFT_CUDA "AUTO" CACHE STRING "Build the GPU paths: AUTO (when a CUDA compiler exists), ON or OFF")
set_property(CACHE WEFT_CUDA PROPERTY STRINGS AUTO ON OFF)

set(WEFT_HAVE_CUDA OFF)
if(NOT WEFT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # H100 / H200. "native" fails where no GPU answers, and CUDA 13 refuses 70.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # CMake 3.25 does not know that nvcc 13 speaks C++20; the headers shared
    # with .cu files (and cxx_std_20 on the libraries) need it.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_path(WEFT_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(WEFT_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(WEFT_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(WEFT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(NOT WEFT_CUDNN_INCLUDE OR NOT WEFT_CUDNN_LIBRARY)
      message(FATAL_ERROR "weft: CUDA found but cuDNN 9 is missing (cudnn.h / libcudnn); set WEFT_CUDA=OFF for a CPU-only build")
    endif()
    add_library(weft::cudnn UNKNOWN IMPORTED)
    set_target_properties(weft::cudnn PROPERTIES IMPORTED_LOCATION ${WEFT_CUDNN_LIBRARY}
                                                 INTERFACE_INCLUDE_DIRECTORIES ${WEFT_CUDNN_INCLUDE})
    if(WEFT_NCCL_INCLUDE AND WEFT_NCCL_LIBRARY)
      add_library(weft::nccl UNKNOWN IMPORTED)
      set_target_properties(weft::nccl PROPERTIES IMPORTED_LOCATION ${WEFT_NCCL_LIBRARY}
                                                  INTERFACE_INCLUDE_DIRECTORIES ${WEFT_NCCL_INCLUDE})
    endif()
    set(WEFT_HAVE_CUDA ON)
    message(STATUS "weft: GPU paths ON (CUDA ${CUDAToolkit_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${WEFT_CUDNN_LIBRARY})")
  elseif(WEFT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "weft: WEFT_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
if(NOT WEFT_HAVE_CUDA)
  message(STATUS "weft: GPU paths OFF (CPU-only build)")
endif()
