/* What Open MPI selected after MPI_Init: the PML component and the initialised BTL modules.
 * Open MPI has no public call for this (MPI_T's "pml" variable is what was asked for, not what
 * was chosen), so its own globals are read, found through the dynamic linker so that nothing
 * links against Open MPI's internal libraries. The structures' layout comes from the headers
 * of the Open MPI this is built against (MINICP_OMPI_INTERNALS); without them, or when the
 * symbols are absent (another MPI), the answer is "unknown". C, not C++: those headers are C. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef MINICP_OMPI_INTERNALS
#include <dlfcn.h>

#include "ompi/mca/pml/base/base.h"
#include "opal/mca/btl/base/base.h"
#endif

/* Returns 1 and fills pml ("ob1") and btls ("self,vader") when it could read them; 0 when the
 * symbols are not in this process (not Open MPI); -1 when built without Open MPI's headers. */
int minicp_ompi_selection(char* pml, size_t pml_len, char* btls, size_t btls_len) {
  pml[0] = '\0', btls[0] = '\0';
#ifdef MINICP_OMPI_INTERNALS
  const mca_pml_base_component_t* sel =
      (const mca_pml_base_component_t*)dlsym(RTLD_DEFAULT, "mca_pml_base_selected_component");
  opal_list_t* list = (opal_list_t*)dlsym(RTLD_DEFAULT, "mca_btl_base_modules_initialized");
  if (!sel || !list) return 0;
  snprintf(pml, pml_len, "%s", sel->pmlm_version.mca_component_name);
  for (opal_list_item_t* it = opal_list_get_first(list); it != opal_list_get_end(list); it = opal_list_get_next(it)) {
    const mca_btl_base_selected_module_t* m = (const mca_btl_base_selected_module_t*)it;
    const size_t used = strlen(btls);
    snprintf(btls + used, btls_len - used, "%s%s", used ? "," : "", m->btl_component->btl_version.mca_component_name);
  }
  return 1;
#else
  (void)pml_len, (void)btls_len;
  return -1;
#endif
}
