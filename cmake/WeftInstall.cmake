# `cmake --install` yields a package consumed with find_package(weft CONFIG).
include(CMakePackageConfigHelpers)

install(TARGETS weft weft_parallel weft_ops weft_engine weft_devices EXPORT weftTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY devices/include/weft engine/include/weft ops/include/weft parallel/include/weft
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(WEFT_INSTALL_HAVE_CUDA ${WEFT_HAVE_CUDA})
if(TARGET weft::nccl)
  set(WEFT_INSTALL_HAVE_NCCL ON)
else()
  set(WEFT_INSTALL_HAVE_NCCL OFF)
endif()
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)

configure_package_config_file(cmake/weftConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/weftConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/weftConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/weftConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/weftConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)

# pkg-config, for builds without CMake (tests/embed/check-embed.sh builds
# examples/embed with it too). Relocatable: paths are relative to the .pc.
set(WEFT_PC_EXTRA_LIBS boost_fiber boost_context ${CMAKE_DL_LIBS})
if(WEFT_HAVE_CUDA)
  list(APPEND WEFT_PC_EXTRA_LIBS -L${CUDAToolkit_LIBRARY_DIR} -lcudnn -lcublas -lcudart)
endif()
if(TARGET weft::nccl)
  list(APPEND WEFT_PC_EXTRA_LIBS -lnccl)
endif()
list(TRANSFORM WEFT_PC_EXTRA_LIBS PREPEND "-l" REGEX "^[^-]")
list(JOIN WEFT_PC_EXTRA_LIBS " " WEFT_PC_EXTRA_LIBS)
# From the .pc's folder back to the prefix: "../.." for lib/pkgconfig,
# "../../.." for lib/x86_64-linux-gnu/pkgconfig.
file(RELATIVE_PATH WEFT_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" WEFT_PC_TO_PREFIX "${WEFT_PC_TO_PREFIX}")
configure_file(cmake/weft.pc.in ${CMAKE_CURRENT_BINARY_DIR}/weft.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/weft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
