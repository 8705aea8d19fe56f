// The environment registry is complete: every MESHTRAIN_* name that appears anywhere in the
// source tree (code, tests, scripts, docs) is declared, no code reads a MESHTRAIN_* variable past
// it, every declaration is read somewhere; and unknown variables are named with the closest one.
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace meshtrain;

const fs::path kSource = MESHTRAIN_SOURCE_DIR;

struct SourceFile {
  fs::path path;
  std::string text;
};

// The project's own text files: code, tests, scripts, deploy files and docs, not build outputs.
const std::vector<SourceFile>& source_files() {
  static const std::vector<SourceFile> files = [] {
    std::vector<SourceFile> out;
    auto add = [&](const fs::path& p) {
      std::ifstream in(p, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      out.push_back({fs::relative(p, kSource), text.str()});
    };
    for (const char* dir :
         {"meshtrain", "apps", "tests", "bench", "fuzz", "scripts", "deploy", "docs", "cmake"}) {
      if (!fs::exists(kSource / dir)) continue;
      for (const auto& e : fs::recursive_directory_iterator(kSource / dir)) {
        if (!e.is_regular_file() || e.file_size() > (size_t{2} << 20)) continue;
        const std::string ext = e.path().extension().string();
        static const std::set<std::string> kText = {".cpp",  ".h",   ".cu",     ".cuh",  ".py",
                                                    ".sh",   ".md",  ".cmake",  ".txt",  ".toml",
                                                    ".yaml", ".yml", ".sbatch", ".json", ""};
        if (kText.count(ext) > 0) add(e.path());
      }
    }
    for (const char* f : {"CMakeLists.txt", "Makefile", "README.md", ".ci/run"}) {
      if (fs::exists(kSource / f)) add(kSource / f);
    }
    return out;
  }();
  return files;
}

bool is_registry_file(const fs::path& p) {
  return p.filename().string().starts_with("env_registry") &&
         p.parent_path() == fs::path("meshtrain/util");
}

// Names that belong to the build rather than the environment: macros (#define, #if, -D,
// target_compile_definitions) and CMake variables and options.
std::set<std::string> build_time_names() {
  std::set<std::string> out;
  const std::regex name("MESHTRAIN_[A-Z0-9_]*[A-Z0-9]");
  const std::regex directive(
      R"(#\s*(define|ifdef|ifndef|if|elif|undef)\b[^\n]*|defined\s*\(\s*MESHTRAIN_\w+|-DMESHTRAIN_\w+)");
  for (const SourceFile& f : source_files()) {
    const std::string file = f.path.filename().string();
    const bool cmake = file == "CMakeLists.txt" || f.path.extension() == ".cmake";
    auto collect = [&](const std::string& text) {
      for (std::sregex_iterator it(text.begin(), text.end(), name), end; it != end; ++it)
        out.insert(it->str());
    };
    if (cmake) {
      // Everything but comments: options, cache variables, definitions.
      std::istringstream lines(f.text);
      for (std::string line; std::getline(lines, line);) collect(line.substr(0, line.find('#')));
      continue;
    }
    for (std::sregex_iterator it(f.text.begin(), f.text.end(), directive), end; it != end; ++it)
      collect(it->str());
  }
  return out;
}

TEST(EnvRegistry, NamesAreUniqueAndInOrderOfTheirIds) {
  std::set<std::string_view> names;
  for (size_t k = 0; k < env_settings().size(); ++k) {
    const EnvSetting& s = env_settings()[k];
    EXPECT_EQ(static_cast<size_t>(s.id), k) << s.name;
    EXPECT_TRUE(s.name.starts_with("MESHTRAIN_")) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " is declared twice";
    EXPECT_FALSE(s.meaning.empty()) << s.name;
    EXPECT_NE(s.readers, 0) << s.name;
    EXPECT_EQ(find_env_setting(s.name), &s);
  }
  EXPECT_EQ(find_env_setting(std::string("MESHTRAIN_") + "NO_SUCH_THING"), nullptr);
  EXPECT_EQ(env_name(Env::log_level), "MESHTRAIN_LOG_LEVEL");
}

TEST(EnvRegistry, EveryMeshtrainNameInTheSourceTreeIsDeclared) {
  const std::set<std::string> build = build_time_names();
  // A few build-time names must be recognised as such, or the exclusion above is broken.
  for (const char* macro : {"MESHTRAIN_SOURCE_DIR", "MESHTRAIN_VERSION", "MESHTRAIN_CONFIG_KEYS"})
    EXPECT_EQ(build.count(macro), 1u) << macro;
  ASSERT_GT(source_files().size(), 100u) << "the source tree was not found at " << kSource;

  // Whole words only: NOT_MESHTRAIN_X or -DMESHTRAIN_X are no variable of ours.
  const std::regex name("[A-Za-z0-9_]*MESHTRAIN_[A-Z0-9_]*[A-Z0-9]_?");
  std::map<std::string, std::string> undeclared;  // name -> first place
  size_t seen = 0;
  for (const SourceFile& f : source_files()) {
    for (std::sregex_iterator it(f.text.begin(), f.text.end(), name), end; it != end; ++it) {
      std::string n = it->str();
      if (!n.starts_with("MESHTRAIN_") || n.back() == '_')
        continue;  // a family ("MESHTRAIN_ETCD_*"), checked below
      ++seen;
      if (build.count(n) > 0 || find_env_setting(n) != nullptr) continue;
      const size_t line = 1 + std::count(f.text.begin(), f.text.begin() + it->position(), '\n');
      undeclared.emplace(n, f.path.string() + ":" + std::to_string(line));
    }
  }
  EXPECT_GT(seen, 100u);
  for (const auto& [n, where] : undeclared)
    ADD_FAILURE() << n << " (" << where
                  << ") is not in meshtrain/util/env_registry.h; declare it there and read it "
                     "with env_value";
  // Declared names are environment variables, never build-time names too.
  for (const EnvSetting& s : env_settings())
    EXPECT_EQ(build.count(std::string(s.name)), 0u) << s.name << " is also a macro";
}

TEST(EnvRegistry, NoCodeReadsAMeshtrainVariablePastTheRegistry) {
  const std::regex direct(R"(getenv\s*\(\s*"MESHTRAIN_)");
  for (const SourceFile& f : source_files()) {
    const auto ext = f.path.extension();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
    if (is_registry_file(f.path)) continue;
    std::smatch m;
    EXPECT_FALSE(std::regex_search(f.text, m, direct))
        << f.path << " reads a MESHTRAIN_* variable with getenv; use env_value(Env::...)";
  }
}

TEST(EnvRegistry, EveryDeclaredVariableIsReadSomewhere) {
  for (const EnvSetting& s : env_settings()) {
    std::string id;
    bool found = false;
    if (s.readers & (kEnvLauncher | kEnvWorker | kEnvTest)) {
      // A program reads it as Env::<id>, the identifier its X-macro entry gives before the name.
      static const std::string header = [] {
        std::ifstream in(kSource / "meshtrain/util/env_registry.h");
        std::ostringstream t;
        t << in.rdbuf();
        return t.str();
      }();
      const std::regex entry("X\\((\\w+),\\s*\"" + std::string(s.name) + "\"");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(header, m, entry)) << s.name;
      id = "Env::" + m[1].str();
      for (const SourceFile& f : source_files()) {
        if (!is_registry_file(f.path) && f.text.find(id) != std::string::npos) found = true;
      }
    }
    if (s.readers & kEnvScript) {
      for (const SourceFile& f : source_files()) {
        const auto top = *f.path.begin();
        if ((top == "deploy" || top == "scripts") && f.text.find(s.name) != std::string::npos)
          found = true;
      }
    }
    EXPECT_TRUE(found) << s.name << " is declared but nothing reads it" << (id.empty() ? "" : " (")
                       << id << (id.empty() ? "" : ")");
  }
}

TEST(EnvRegistry, TheDocsPageListsEveryVariableWithItsDefault) {
  std::ifstream in(kSource / "docs/environment.md");
  ASSERT_TRUE(in) << "docs/environment.md is missing";
  std::map<std::string, std::string> rows;  // name -> its table row
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("| `MESHTRAIN_"))
      rows.emplace(line.substr(3, line.find('`', 3) - 3), line);
  }
  for (const EnvSetting& s : env_settings()) {
    auto it = rows.find(std::string(s.name));
    ASSERT_NE(it, rows.end()) << s.name << " is missing from docs/environment.md";
    const std::string fallback = s.fallback.empty() ? "-" : std::string(s.fallback);
    EXPECT_NE(it->second.find("| " + std::string(s.type) + " | " + fallback + " | "),
              std::string::npos)
        << it->second;
  }
  EXPECT_EQ(rows.size(), env_settings().size()) << "docs/environment.md lists unknown variables";
}

TEST(EnvRegistry, UnknownVariablesAreNamedWithTheClosestKnownOne) {
  // Misspellings are put together here, or the scan of the tree above would find them.
  const std::string p = "MESHTRAIN_";
  const std::vector<std::string> environment = {"PATH=/usr/bin",       "MESHTRAIN_LOG_LEVEL=debug",
                                                p + "LOG_LEVL=debug",  p + "SHM_STEPBYTES=1",
                                                "MESHTRAIN_TOKEN=x=y", "NOT_" + p + "THING=1"};
  const auto lines = unknown_env_warnings(environment);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(
      lines[0],
      "unknown environment variable " + p +
          "LOG_LEVL (did you mean MESHTRAIN_LOG_LEVEL? `meshtrain env` lists the known ones)");
  EXPECT_NE(lines[1].find(p + "SHM_STEPBYTES (did you mean MESHTRAIN_SHM_STEP_BYTES?"),
            std::string::npos)
      << lines[1];
  EXPECT_EQ(closest_env_name(p + "RDZV_ENDPONT"), "MESHTRAIN_RDZV_ENDPOINT");
  EXPECT_EQ(closest_env_name(p + "TOKENFILE"), "MESHTRAIN_TOKEN_FILE");
  EXPECT_TRUE(unknown_env_warnings(std::vector<std::string>{"MESHTRAIN_HOST_ID="}).empty());
}

// Sets a variable for one scope and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value == nullptr) {
      ::unsetenv(name_.c_str());
    } else {
      ::setenv(name_.c_str(), value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(EnvRegistry, AnEmptyValueReadsAsUnset) {
  ScopedEnv host("MESHTRAIN_HOST_ID", "");
  EXPECT_FALSE(env_value(Env::host_id).has_value());
  EXPECT_TRUE(env_is_set(Env::host_id));
  ScopedEnv set("MESHTRAIN_HOST_ID", "rack4");
  EXPECT_EQ(env_value(Env::host_id), "rack4");
}

TEST(EnvRegistry, ANumberThatIsNotOneIsOneLineNamingTheVariable) {
  {
    ScopedEnv unset("MESHTRAIN_SHM_STEP_BYTES", nullptr);
    EXPECT_FALSE(env_count(Env::shm_step_bytes).has_value());
  }
  ScopedEnv good("MESHTRAIN_SHM_STEP_BYTES", "65536");
  EXPECT_EQ(env_count(Env::shm_step_bytes), 65536u);
  for (const char* bad : {"64k", "-1", "1e6", " 5"}) {
    ScopedEnv set("MESHTRAIN_SHM_STEP_BYTES", bad);
    try {
      (void)env_count(Env::shm_step_bytes);
      ADD_FAILURE() << bad << " was read as a number";
    } catch (const ValueError& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("environment variable MESHTRAIN_SHM_STEP_BYTES='") + bad +
                    "' is not a whole number (bytes); unset it or see `meshtrain env`");
    }
  }
  // A text variable is not read as a number: a programming error, not bad input.
  EXPECT_THROW((void)env_count(Env::host_id), Error);
}

TEST(EnvRegistry, ARealNumberThatIsNotOneIsOneLineNamingTheVariable) {
  {
    ScopedEnv unset("MESHTRAIN_S3_RETRY_MAX_S", nullptr);
    EXPECT_FALSE(env_real(Env::s3_retry_max_s).has_value());
  }
  {
    ScopedEnv good("MESHTRAIN_S3_RETRY_MAX_S", "0.5");
    EXPECT_EQ(env_real(Env::s3_retry_max_s), 0.5);
  }
  for (const char* bad : {"half", "-1", "inf", "2s", " 5"}) {
    ScopedEnv set("MESHTRAIN_S3_RETRY_MAX_S", bad);
    try {
      (void)env_real(Env::s3_retry_max_s);
      ADD_FAILURE() << bad << " was read as a number";
    } catch (const ValueError& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("environment variable MESHTRAIN_S3_RETRY_MAX_S='") + bad +
                    "' is not a non-negative number (float); unset it or see `meshtrain env`");
    }
  }
  // A whole-number variable is not read as a real one: a programming error, not bad input.
  EXPECT_THROW((void)env_real(Env::s3_parallel), Error);
}

TEST(EnvRegistry, ReportShowsValuesHidesSecretsAndTestOnlyVariables) {
  ScopedEnv level("MESHTRAIN_LOG_LEVEL", "warn");
  ScopedEnv token("MESHTRAIN_TOKEN", "very-secret-token");
  ScopedEnv algo("MESHTRAIN_COMM_ALGO", nullptr);
  const std::string report = env_report(false);
  EXPECT_NE(report.find("MESHTRAIN_LOG_LEVEL = 'warn'"), std::string::npos) << report;
  EXPECT_NE(report.find("MESHTRAIN_TOKEN = (set)"), std::string::npos) << report;
  EXPECT_EQ(report.find("very-secret-token"), std::string::npos) << report;
  EXPECT_NE(report.find("MESHTRAIN_COMM_ALGO = (unset)"), std::string::npos) << report;
  EXPECT_EQ(report.find("MESHTRAIN_TEST_REQUIRE"), std::string::npos) << report;
  const std::string all = env_report(true);
  for (const EnvSetting& s : env_settings())
    EXPECT_NE(all.find(std::string(s.name) + " = "), std::string::npos) << s.name;
  EXPECT_NE(all.find("(test only)"), std::string::npos);
}

}  // namespace
