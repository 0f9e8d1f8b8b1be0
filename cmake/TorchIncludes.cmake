# The include directories a LibTorch other than Debian's needs fixed before dt compiles against it
# (after find_package(Torch)). Verified with the torch-2.11.0+cu130 wheel on an H100 machine.

# LibTorch's ProcessGroupGloo.hpp includes Gloo's headers. Debian's LibTorch has them (libgloo-dev,
# in /usr/include); the PyTorch wheels ship none. Debian's libgloo-dev headers build and run a Gloo
# group with the 2.11 wheel; DT_GLOO_INCLUDE_DIR names another Gloo include tree.
find_path(DT_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS})
if(NOT DT_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "this LibTorch ships no Gloo headers (gloo/algorithm.h), which its ProcessGroupGloo.hpp "
                      "includes: install libgloo-dev (Debian, Ubuntu) or set DT_GLOO_INCLUDE_DIR to a Gloo "
                      "include directory")
endif()
if(NOT DT_GLOO_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
  include_directories(SYSTEM ${DT_GLOO_INCLUDE_DIR})
endif()

# The PyTorch wheels (torch/include/google) carry the protobuf headers LibTorch was built with. The
# compiler searches LibTorch's -isystem directory before /usr/include, so those would shadow the
# protobuf that dt's generated code (protoc 3.21) is compiled against. dt's targets see LibTorch's
# include directory through a copy of its entries made of links, without google/.
function(dt_hide_bundled_protobuf)
  # The system's protobuf is the one to use where LibTorch's headers are the system's (Debian).
  set(system_dirs)
  foreach(dir ${Protobuf_INCLUDE_DIRS} ${CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES})
    get_filename_component(real "${dir}" REALPATH)
    list(APPEND system_dirs "${real}")
  endforeach()
  get_property(imported DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY IMPORTED_TARGETS)
  foreach(target ${imported})
    get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT dirs)
      continue()
    endif()
    set(changed FALSE)
    set(new_dirs)
    foreach(dir ${dirs})
      get_filename_component(real "${dir}" REALPATH)
      if(EXISTS "${real}/google/protobuf" AND NOT real IN_LIST system_dirs)
        string(SHA1 key "${real}")
        set(overlay "${CMAKE_BINARY_DIR}/torch-include-${key}")
        if(NOT EXISTS "${overlay}")
          file(GLOB entries RELATIVE "${real}" "${real}/*")
          list(REMOVE_ITEM entries google)
          file(MAKE_DIRECTORY "${overlay}")
          foreach(entry ${entries})
            file(CREATE_LINK "${real}/${entry}" "${overlay}/${entry}" SYMBOLIC)
          endforeach()
          message(STATUS "LibTorch's ${real}/google (its own protobuf) hidden from dt's code: ${overlay}")
        endif()
        list(APPEND new_dirs "${overlay}")
        set(changed TRUE)
      else()
        list(APPEND new_dirs "${dir}")
      endif()
    endforeach()
    if(changed)
      set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${new_dirs}")
    endif()
  endforeach()
endfunction()
dt_hide_bundled_protobuf()
