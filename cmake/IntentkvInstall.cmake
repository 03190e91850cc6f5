include(CMakePackageConfigHelpers)

install(FILES ${PROJECT_SOURCE_DIR}/include/intentkv.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS intentkv intentkv_static EXPORT intentkvTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT intentkvTargets NAMESPACE intentkv:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/intentkv)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/intentkvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/intentkvConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/intentkv)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/intentkvConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/intentkvConfig.cmake ${PROJECT_BINARY_DIR}/intentkvConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/intentkv)

# pkg-config: the shared library needs nothing more; a static link also needs
# what the objects use (Libs.private).
set(IKV_PC_LIBS_PRIVATE "-lstdc++ -lmimalloc -lpthread -lm")  # the C++ runtime first: see CMakeLists.txt
if(IKV_HAVE_CUDA)
  string(APPEND IKV_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcudart_static -ldl -lrt")
endif()
# The .pc file finds the prefix from its own location, so an installed tree
# can be moved (or installed with `cmake --install --prefix`).
file(RELATIVE_PATH IKV_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" IKV_PC_TO_PREFIX "${IKV_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/pkgconfig/intentkv.pc.in ${PROJECT_BINARY_DIR}/intentkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/intentkv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
