// Tests of kat/version.hpp, the header CMake generates from project(KAT VERSION ...): its macros
// must give the version CMakeLists.txt declares, which tests/CMakeLists.txt passes to this file
// alone as KAT_TEST_PROJECT_VERSION_{MAJOR,MINOR,PATCH} and KAT_TEST_PROJECT_VERSION.
#include <catch2/catch.hpp>

#include "kat/version.hpp"

#include <string>

#if !defined(KAT_TEST_PROJECT_VERSION) || !defined(KAT_TEST_PROJECT_VERSION_MAJOR) ||              \
    !defined(KAT_TEST_PROJECT_VERSION_MINOR) || !defined(KAT_TEST_PROJECT_VERSION_PATCH)
#error "tests/CMakeLists.txt passes the project's version to test_version.cpp"
#endif

namespace test_version {

// The macros are usable in the preprocessor, as a user's #if would use them.
#if KAT_VERSION != KAT_VERSION_MAJOR * 10000 + KAT_VERSION_MINOR * 100 + KAT_VERSION_PATCH
#error "KAT_VERSION is not major * 10000 + minor * 100 + patch"
#endif

TEST_CASE("version: the KAT_VERSION macros give the version CMakeLists.txt declares", "[version]") {
  CHECK(KAT_VERSION_MAJOR == KAT_TEST_PROJECT_VERSION_MAJOR);
  CHECK(KAT_VERSION_MINOR == KAT_TEST_PROJECT_VERSION_MINOR);
  CHECK(KAT_VERSION_PATCH == KAT_TEST_PROJECT_VERSION_PATCH);
  CHECK(std::string(KAT_VERSION_STRING) == KAT_TEST_PROJECT_VERSION);
  CHECK(std::string(KAT_VERSION_STRING) == std::to_string(KAT_VERSION_MAJOR) + "." +
                                               std::to_string(KAT_VERSION_MINOR) + "." +
                                               std::to_string(KAT_VERSION_PATCH));
}

TEST_CASE("version: KAT_VERSION orders versions as numbers", "[version]") {
  // major * 10000 + minor * 100 + patch is unique and ordered only while minor and patch
  // stay below 100.
  STATIC_REQUIRE(KAT_VERSION_MINOR >= 0);
  STATIC_REQUIRE(KAT_VERSION_MINOR < 100);
  STATIC_REQUIRE(KAT_VERSION_PATCH >= 0);
  STATIC_REQUIRE(KAT_VERSION_PATCH < 100);
  CHECK(KAT_VERSION == KAT_TEST_PROJECT_VERSION_MAJOR * 10000 +
                           KAT_TEST_PROJECT_VERSION_MINOR * 100 + KAT_TEST_PROJECT_VERSION_PATCH);
  CHECK(KAT_VERSION > 100); // after 0.1.0, the first version with no version header
}

} // namespace test_version
