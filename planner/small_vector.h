// A vector that keeps up to N elements inside itself and moves to the heap beyond that, for
// trivially copyable elements. Planning builds millions of short lists (an instruction's
// operands, the tensors that hold a value in a lane); a heap vector each cost an allocation
// and, for every reader, a cache miss. The interface is the part of std::vector they use.
// Not boost::container::small_vector: it keeps a pointer, a size and a capacity beside the
// inline storage, 48 bytes for three operands against 32 here (a uint32 size and capacity,
// the heap pointer sharing its bytes with the inline elements), and a 512-rank plan holds a
// million instructions: their bytes are its page faults, a quarter of the command
// (docs/planner.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace weft::planner {

template <class T, uint32_t N>
class SmallVector {
 public:
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static constexpr uint32_t kInline = N;
  using value_type = T;
  using size_type = size_t;
  using iterator = T*;
  using const_iterator = const T*;
  using reference = T&;
  using const_reference = const T&;

  SmallVector() = default;
  SmallVector(std::initializer_list<T> l) { assign(l.begin(), l.end()); }
  SmallVector(const std::vector<T>& v) { assign(v.data(), v.data() + v.size()); }  // NOLINT
  SmallVector(const SmallVector& o) { assign(o.begin(), o.end()); }
  SmallVector(SmallVector&& o) noexcept { take(o); }
  ~SmallVector() { release(); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> l) {
    assign(l.begin(), l.end());
    return *this;
  }
  SmallVector& operator=(const std::vector<T>& v) {
    assign(v.data(), v.data() + v.size());
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return cap_; }
  T* data() { return cap_ > kInline ? u_.heap : u_.local; }
  const T* data() const { return cap_ > kInline ? u_.heap : u_.local; }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& at(size_t i) {
    if (i >= size_) throw std::out_of_range("SmallVector::at");
    return data()[i];
  }
  const T& at(size_t i) const {
    if (i >= size_) throw std::out_of_range("SmallVector::at");
    return data()[i];
  }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  void clear() { size_ = 0; }
  void push_back(const T& o) {
    const T copy = o;  // `o` may lie in this list
    if (size_ == cap_) grow(size_t(cap_) * 2);
    data()[size_++] = copy;
  }
  template <class... A>
  T& emplace_back(A&&... a) {
    push_back(T(static_cast<A&&>(a)...));
    return back();
  }
  void assign(const T* first, const T* last) {
    const size_t n = size_t(last - first);
    if (n > cap_) {
      release();
      grow(n);
    }
    if (n) std::memmove(data(), first, n * sizeof(T));
    size_ = uint32_t(n);
  }
  iterator erase(const_iterator first, const_iterator last) {
    T* f = begin() + (first - begin());
    const size_t n = size_t(last - first);
    std::memmove(f, f + n, size_t(end() - (f + n)) * sizeof(T));
    size_ -= uint32_t(n);
    return f;
  }
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

  bool operator==(const SmallVector& o) const { return std::equal(begin(), end(), o.begin(), o.end()); }

 private:
  void grow(size_t n) {
    T* p = static_cast<T*>(::operator new(n * sizeof(T)));
    if (size_) std::memcpy(p, data(), size_ * sizeof(T));
    if (cap_ > kInline) ::operator delete(u_.heap);
    u_.heap = p;
    cap_ = uint32_t(n);
  }
  void release() {
    if (cap_ > kInline) ::operator delete(u_.heap);
    cap_ = kInline;
    size_ = 0;
  }
  void take(SmallVector& o) {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.cap_ > kInline) u_.heap = o.u_.heap;
    else std::memcpy(u_.local, o.u_.local, sizeof(u_.local));
    o.cap_ = kInline;
    o.size_ = 0;
  }

  uint32_t size_ = 0, cap_ = kInline;
  union U {
    T* heap;
    T local[kInline];
    U() : heap(nullptr) {}
  } u_;
};
}  // namespace weft::planner
