// The one reading of a "host:port" endpoint (the snapshot agents' peers, the agents' peer
// check).
#include "base/host.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace weft {

TEST(SplitEndpoint, ReadsHostAndPortAndUnbracketsAnIpv6Address) {
  EXPECT_EQ(split_endpoint("10.0.0.2:29500"),
            std::make_pair(std::string("10.0.0.2"), uint16_t(29500)));
  EXPECT_EQ(split_endpoint("node-a:1"), std::make_pair(std::string("node-a"), uint16_t(1)));
  EXPECT_EQ(split_endpoint("[::1]:65535"), std::make_pair(std::string("::1"), uint16_t(65535)));
}

TEST(SplitEndpoint, RefusesWhatIsNotHostColonPortNamingTheText) {
  for (const char* bad : {"host", ":29500", "host:", "host:65536", "host:12ab", "host:-1"}) {
    try {
      split_endpoint(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace weft
