// Ledger load: booking latency (p50/p99) with N concurrent client processes on one SQLite ledger,
// and the time of an earliest-start query on a ledger holding many reservations.
//   bench_ledger [--clients 32] [--bookings 20] [--reservations 10000] [--dir /tmp]
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/cluster/ledger.h"
#include "runtime/core/check.h"

namespace {

using berth::Device;
using berth::ReserveRequest;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

std::vector<Device> slots(int hosts, int per_host) {
  std::vector<Device> v;
  for (int h = 0; h < hosts; ++h)
    for (int i = 0; i < per_host; ++i)
      v.push_back(Device{0, "node" + std::to_string(h), "gpu", i, "H100", int64_t(80) << 30, ""});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 32, bookings = 20, reservations = 10000;
  std::string dir = "/tmp";
  CLI::App app{"Ledger booking latency under concurrent clients, and earliest-start query time"};
  app.add_option("--clients", clients, "Processes booking at once")->check(CLI::Range(1, 256));
  app.add_option("--bookings", bookings, "Bookings per client")->check(CLI::Range(1, 10000));
  app.add_option("--reservations", reservations, "Reservations in the query benchmark's ledger")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--dir", dir, "Where the ledgers are made (removed at the end)")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
  const std::string base = dir + "/berth_bench_ledger_" + std::to_string(getpid());
  std::filesystem::create_directories(base);
  const double now = std::floor(berth::system_clock()() / 3600) * 3600 + 3600;

  // 1. Booking latency: `clients` processes, each booking `bookings` 1-device windows in turn
  //    (own window slots, so every booking succeeds and writes), on 16 hosts x 8 devices.
  const std::string path = base + "/load.db";
  berth::open_sqlite_ledger(path, berth::LedgerOptions{})->register_devices(slots(16, 8));
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const auto wall0 = std::chrono::steady_clock::now();
  for (int c = 0; c < clients; ++c) {
    if (fork() == 0) {
      close(fds[0]);
      auto l = berth::open_sqlite_ledger(path, berth::LedgerOptions{});
      for (int b = 0; b < bookings; ++b) {
        ReserveRequest q;
        q.count = 1;
        q.start = now + (double(c) * bookings + b) * 3600;
        q.duration_s = 1800;
        q.owner = "client" + std::to_string(c);
        const auto t = std::chrono::steady_clock::now();
        const bool ok = l->reserve(q).booked;
        const double s = ok ? seconds_since(t) : -1;
        if (write(fds[1], &s, sizeof s) != sizeof s) _exit(2);
      }
      _exit(0);
    }
  }
  close(fds[1]);
  std::vector<double> lat;
  double s = 0;
  int failed = 0;
  while (read(fds[0], &s, sizeof s) == sizeof s) {
    if (s < 0) failed++; else lat.push_back(s);
  }
  while (wait(nullptr) > 0) {
  }
  const double wall = seconds_since(wall0);
  std::printf("booking latency, %d concurrent client processes x %d bookings on one SQLite ledger "
              "(WAL, synchronous=FULL, BEGIN IMMEDIATE), 128 devices:\n",
              clients, bookings);
  std::printf("  %zu booked, %d refused | p50 %.2f ms | p90 %.2f ms | p99 %.2f ms | max %.2f ms | "
              "%.0f bookings/s overall\n",
              lat.size(), failed, quantile(lat, 0.5) * 1e3, quantile(lat, 0.9) * 1e3,
              quantile(lat, 0.99) * 1e3, quantile(lat, 1.0) * 1e3, double(lat.size()) / wall);

  // 2. Earliest start on a ledger holding `reservations` bookings (inserted in one transaction),
  //    64 devices each booked back to back; the query asks for all 64 devices at once, so the
  //    sweep has to pass every booking end.
  const std::string big = base + "/big.db";
  berth::open_sqlite_ledger(big, berth::LedgerOptions{})->register_devices(slots(8, 8));
  {
    sqlite3* db = nullptr;
    sqlite3_open(big.c_str(), &db);
    sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
    sqlite3_stmt* r = nullptr;
    sqlite3_stmt* b = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO reservations(name, owner, priority, start, end, state, "
                           "created, model, min_free_mem) VALUES('', 'load', 3, ?, ?, 'active', "
                           "0, '', 0)", -1, &r, nullptr);
    sqlite3_prepare_v2(db, "INSERT INTO booked VALUES(?, ?)", -1, &b, nullptr);
    for (int k = 0; k < reservations; ++k) {
      const int dev = 1 + k % 64, slot = k / 64;
      const double st = now + slot * 3600.0 + (dev % 7) * 60.0;
      sqlite3_bind_double(r, 1, st);
      sqlite3_bind_double(r, 2, st + 3000);
      sqlite3_step(r);
      sqlite3_reset(r);
      sqlite3_bind_int64(b, 1, sqlite3_last_insert_rowid(db));
      sqlite3_bind_int64(b, 2, dev);
      sqlite3_step(b);
      sqlite3_reset(b);
    }
    sqlite3_finalize(r);
    sqlite3_finalize(b);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  berth::LedgerOptions o;
  o.clock = [now] { return now - 60; };
  auto l = berth::open_sqlite_ledger(big, o);
  std::vector<double> q_s;
  double found = 0;
  for (int rep = 0; rep < 5; ++rep) {
    ReserveRequest q;
    q.count = 64;
    q.start = now;
    q.duration_s = 1800;
    q.owner = "query";
    const auto t = std::chrono::steady_clock::now();
    const berth::BookingResult res = l->reserve(q);  // refused: answers the earliest start
    q_s.push_back(seconds_since(t));
    found = res.earliest_start;
  }
  std::printf("earliest-start query, %d reservations on 64 devices, request for all 64: median "
              "%.1f ms (min %.1f, max %.1f) over 5 queries; earliest start %.0f h after the "
              "first booking\n",
              reservations, quantile(q_s, 0.5) * 1e3, quantile(q_s, 0.0) * 1e3,
              quantile(q_s, 1.0) * 1e3, (found - now) / 3600);
  std::filesystem::remove_all(base);
  return 0;
}
