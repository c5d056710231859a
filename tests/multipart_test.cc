// multipart/form-data (server/edge/multipart.h): the parts of bodies as curl, browsers and the
// SDKs send them (a preamble, quoted and bare parameters, a file's name and type, binary data
// holding CRs and dashes, a part without a Content-Type), and a clear refusal for each kind of
// malformed body. And the UTF-8 check a form's text fields go through (server/core/utf8.h).
#include "server/edge/multipart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/core/utf8.h"

namespace krause::server {
namespace {

using ::testing::HasSubstr;

TEST(Multipart, TheBoundaryComesFromTheContentType) {
  EXPECT_EQ(*FormBoundary("multipart/form-data; boundary=abc"), "abc");
  EXPECT_EQ(*FormBoundary("Multipart/Form-Data;boundary=\"a b:c\"; charset=utf-8"), "a b:c");
  EXPECT_THAT(FormBoundary("application/json").status().message(),
              HasSubstr("send multipart/form-data"));
  EXPECT_THAT(FormBoundary("multipart/form-data").status().message(), HasSubstr("boundary"));
  EXPECT_THAT(FormBoundary(absl::StrCat("multipart/form-data; boundary=", std::string(71, 'x')))
                  .status()
                  .message(),
              HasSubstr("1 to 70"));
}

// What a form's text must be (server/core/utf8.h), and the same text made safe to echo.
TEST(Utf8, IsCheckedAsRfc3629SaysAndBadBytesAreReplaced) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("Ankle boot"));
  EXPECT_TRUE(IsUtf8("T-shirt \xc3\xa9 \xe2\x82\xac \xf0\x9f\x91\x9f"));  // e-acute, euro, shoe
  for (const char* bad : {"\x80", "\xc3", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80",
                          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "a\xe2\x82", "\xff"})
    EXPECT_FALSE(IsUtf8(bad)) << absl::CHexEscape(bad);
  EXPECT_EQ(ValidUtf8("ok \xc3\xa9"), "ok \xc3\xa9");
  // A character cut at its end, and a stray byte: each bad byte one U+FFFD.
  EXPECT_EQ(ValidUtf8("a\xe2\x82"), "a\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(ValidUtf8("\xff!"), "\xef\xbf\xbd!");
  EXPECT_TRUE(IsUtf8(ValidUtf8("\xc0\xaf\xed\xa0\x80 x \xf4\x90\x80\x80")));
}

TEST(Multipart, PartsAreSplitWithTheirNamesFilesAndTypes) {
  constexpr char kBinary[] = "\x89PNG\r\n\x1a\n\0\r\n-- not a delimiter\r\n--X";
  const std::string binary(kBinary, sizeof(kBinary) - 1);
  const std::string body =
      absl::StrCat("a preamble to ignore\r\n--XY\r\n",
                   "Content-Disposition: form-data; name=\"prompt\"\r\n\r\nSneaker\r\n--XY\r\n",
                   "content-disposition: form-data; name=image; filename=\"in \\\"1\\\".png\"\r\n",
                   "Content-Type: image/png\r\n\r\n", binary, "\r\n--XY  \r\n",
                   "Content-Disposition: form-data; name=\"n\"\r\n\r\n\r\n--XY--\r\nan epilogue");
  auto parts = ParseMultipartForm("multipart/form-data; boundary=XY", body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].name, "prompt");
  EXPECT_EQ((*parts)[0].data, "Sneaker");
  EXPECT_EQ((*parts)[0].filename, "");
  EXPECT_EQ((*parts)[1].name, "image");
  EXPECT_EQ((*parts)[1].filename, "in \"1\".png");
  EXPECT_EQ((*parts)[1].content_type, "image/png");
  EXPECT_EQ((*parts)[1].data, binary);
  EXPECT_EQ((*parts)[2].name, "n");
  EXPECT_EQ((*parts)[2].data, "");  // an empty value
  // No preamble: the first delimiter at the body's start.
  parts = ParseMultipartForm("multipart/form-data; boundary=XY",
                             "--XY\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--XY--");
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].data, "1");
}

TEST(Multipart, MalformedBodiesAreRefusedSayingWhy) {
  const std::string type = "multipart/form-data; boundary=XY";
  const std::string head = "--XY\r\nContent-Disposition: form-data; name=a\r\n\r\n";
  struct Case {
    std::string body, why;
  } cases[] = {
      {"no delimiter at all", "has no delimiter --XY"},
      {head + "1", "ends inside part \"a\": no closing delimiter"},
      {head + "1\r\n--XYjunk", "no line end (CRLF) after the delimiter"},
      {"--XY\r\nContent-Type: text/plain\r\n\r\n1\r\n--XY--", "without a Content-Disposition"},
      {"--XY\r\nContent-Disposition: attachment\r\n\r\n1\r\n--XY--", "needs form-data; name="},
      {"--XY\r\nContent-Disposition: form-data; name=\"a\r\n\r\n1\r\n--XY--", "needs form-data"},
      {"--XY\r\nno colon here\r\n\r\n1\r\n--XY--", "without a colon"},
      {"--XY\r\nContent-Disposition: form-data; name=a\r\n" + std::string(9000, 'x'),
       "do not end within 8192 bytes"},
  };
  for (const Case& c : cases) {
    auto parts = ParseMultipartForm(type, c.body);
    EXPECT_EQ(parts.status().code(), absl::StatusCode::kInvalidArgument) << c.body.substr(0, 60);
    EXPECT_THAT(parts.status().message(), HasSubstr(c.why)) << c.body.substr(0, 60);
  }
  std::string many;
  for (size_t i = 0; i <= kMaxFormParts; ++i) many += head + "1\r\n";
  EXPECT_THAT(ParseMultipartForm(type, many + "--XY--").status().message(),
              HasSubstr("has over 64 parts"));
}

}  // namespace
}  // namespace krause::server
